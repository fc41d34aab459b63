// HTML report: binned time series rendered as inline SVG.
#include "report_html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace tilelab::sim {
namespace {

constexpr int kLabelWidth = 120;   // px left of every chart for row labels / the y axis
constexpr int kPlotWidth = 900;    // px of the time axis
constexpr int kRowHeight = 16;     // px per timeline row
constexpr int kChartHeight = 180;  // px of a line/area chart
constexpr int kOpacityLevels = 8;  // busy fractions are quantized so equal neighbours merge

// Engine colours (timeline rows, legend).
const char* const kEngineColors[kEngineCount] = {"#d1495b", "#00798c", "#edae49", "#66a182",
                                                 "#8d96a3"};
constexpr const char* kDmaColor = "#2e4057";
constexpr const char* kGatherColor = "#e07a5f";

std::string escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string fmt(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

std::string bytes_label(double bytes) {
  if (bytes >= 1048576) return fmt("%.0f MiB", bytes / 1048576);
  if (bytes >= 1024) return fmt("%.0f KiB", bytes / 1024);
  return fmt("%.0f B", bytes);
}

// Adds `amount` spread uniformly over [start, end) into bins of width total / bins.
void spread(std::vector<double>& bins, double total, double start, double end, double amount) {
  if (total <= 0 || end <= start) return;
  const int n = static_cast<int>(bins.size());
  const double width = total / n;
  const int first = std::clamp(static_cast<int>(start / width), 0, n - 1);
  const int last = std::clamp(static_cast<int>(end / width), 0, n - 1);
  const double rate = amount / (end - start);
  for (int b = first; b <= last; ++b) {
    const double lo = std::max(start, b * width), hi = std::min(end, (b + 1) * width);
    if (hi > lo) bins[size_t(b)] += rate * (hi - lo);
  }
}

// One timeline row: busy fraction per bin, drawn as merged rectangles of quantized opacity.
void timeline_row(std::ostringstream& svg, const std::vector<double>& busy_ns, double bin_ns, int y,
                  const std::string& label, const char* color, double total_busy_ns,
                  double total_ns) {
  svg << "<text x='" << kLabelWidth - 6 << "' y='" << y + kRowHeight - 4
      << "' text-anchor='end' class='lbl'>" << escape(label) << "</text>";
  svg << "<rect x='" << kLabelWidth << "' y='" << y << "' width='" << kPlotWidth << "' height='"
      << kRowHeight - 2 << "' fill='#f3f3f3'><title>" << escape(label) << ": "
      << fmt("%.1f", total_ns > 0 ? 100 * total_busy_ns / total_ns : 0) << "% busy</title></rect>";
  const int n = static_cast<int>(busy_ns.size());
  const double px = double(kPlotWidth) / n;
  int b = 0;
  while (b < n) {
    const int level = static_cast<int>(
        std::lround(std::clamp(busy_ns[size_t(b)] / bin_ns, 0.0, 1.0) * kOpacityLevels));
    int e = b + 1;
    while (e < n &&
           std::lround(std::clamp(busy_ns[size_t(e)] / bin_ns, 0.0, 1.0) * kOpacityLevels) == level)
      ++e;
    if (level > 0)
      svg << "<rect x='" << fmt("%.1f", kLabelWidth + b * px) << "' y='" << y << "' width='"
          << fmt("%.1f", (e - b) * px) << "' height='" << kRowHeight - 2 << "' fill='" << color
          << "' fill-opacity='" << fmt("%.3f", double(level) / kOpacityLevels) << "'/>";
    b = e;
  }
}

void time_axis(std::ostringstream& svg, int y, double total_ns) {
  for (int i = 0; i <= 4; ++i) {
    const double x = kLabelWidth + kPlotWidth * i / 4.0;
    svg << "<line x1='" << x << "' y1='" << y << "' x2='" << x << "' y2='" << y + 4
        << "' stroke='#444'/><text x='" << x << "' y='" << y + 16
        << "' text-anchor='middle' class='lbl'>" << fmt("%.0f us", total_ns * i / 4 / 1e3)
        << "</text>";
  }
}

// An area chart of one or more stacked series sharing the time axis; `reference` draws a dashed
// horizontal line (a peak or a capacity).
struct Series {
  std::string name;
  std::string color;
  std::vector<double> values;
};
std::string area_chart(const std::vector<Series>& stacked, double total_ns, double reference,
                       const std::string& reference_label, const std::string& unit) {
  const size_t n = stacked.empty() ? 0 : stacked.front().values.size();
  std::vector<double> top(n, 0.0);
  double y_max = reference;
  for (const auto& s : stacked)
    for (size_t i = 0; i < n; ++i) y_max = std::max(y_max, top[i] += s.values[i]);
  if (y_max <= 0) y_max = 1;
  y_max *= 1.05;
  std::ostringstream svg;
  const int height = kChartHeight + 30;
  svg << "<svg class='chart' viewBox='0 0 " << kLabelWidth + kPlotWidth + 10 << " " << height
      << "' width='" << kLabelWidth + kPlotWidth + 10 << "' height='" << height << "'>";
  auto y_of = [&](double v) { return kChartHeight - kChartHeight * v / y_max + 4; };
  for (int i = 0; i <= 4; ++i) {
    const double v = y_max * i / 4;
    svg << "<line x1='" << kLabelWidth << "' y1='" << fmt("%.1f", y_of(v)) << "' x2='"
        << kLabelWidth + kPlotWidth << "' y2='" << fmt("%.1f", y_of(v))
        << "' stroke='#e4e4e4'/><text x='" << kLabelWidth - 6 << "' y='" << fmt("%.1f", y_of(v) + 4)
        << "' text-anchor='end' class='lbl'>" << fmt("%.3g", v) << " " << escape(unit) << "</text>";
  }
  std::vector<double> base(n, 0.0);
  const double px = n ? double(kPlotWidth) / double(n) : 0;
  for (const auto& s : stacked) {
    std::ostringstream points;
    for (size_t i = 0; i < n; ++i)
      points << fmt("%.1f", kLabelWidth + i * px) << "," << fmt("%.1f", y_of(base[i] + s.values[i]))
             << " " << fmt("%.1f", kLabelWidth + (i + 1) * px) << ","
             << fmt("%.1f", y_of(base[i] + s.values[i])) << " ";
    for (size_t i = n; i-- > 0;)
      points << fmt("%.1f", kLabelWidth + (i + 1) * px) << "," << fmt("%.1f", y_of(base[i])) << " "
             << fmt("%.1f", kLabelWidth + i * px) << "," << fmt("%.1f", y_of(base[i])) << " ";
    svg << "<polygon class='series' points='" << points.str() << "' fill='" << s.color
        << "' fill-opacity='0.75' stroke='none'><title>" << escape(s.name) << "</title></polygon>";
    for (size_t i = 0; i < n; ++i) base[i] += s.values[i];
  }
  if (reference > 0)
    svg << "<line x1='" << kLabelWidth << "' y1='" << fmt("%.1f", y_of(reference)) << "' x2='"
        << kLabelWidth + kPlotWidth << "' y2='" << fmt("%.1f", y_of(reference))
        << "' stroke='#000' stroke-dasharray='5,4'/><text x='" << kLabelWidth + kPlotWidth - 4
        << "' y='" << fmt("%.1f", y_of(reference) - 4) << "' text-anchor='end' class='lbl'>"
        << escape(reference_label) << "</text>";
  time_axis(svg, kChartHeight + 4, total_ns);
  svg << "</svg><div class='legend'>";
  for (const auto& s : stacked)
    svg << "<span><i style='background:" << s.color << "'></i>" << escape(s.name) << "</span>";
  svg << "</div>";
  return svg.str();
}

std::string row(const std::string& name, const std::string& value) {
  return "<tr><th>" + escape(name) + "</th><td>" + escape(value) + "</td></tr>";
}

const DmaKindSummary* kind_of(const Report& r, const std::string& kind) {
  for (const auto& k : r.dma_by_kind)
    if (k.kind == kind) return &k;
  return nullptr;
}

}  // namespace

std::string report_html(const Program& p, const TimingResult& t, const Report& r,
                        const HtmlOptions& options) {
  const Machine& m = p.machine;
  const double total = std::max(t.total_ns, 1e-9);
  const int bins = std::max(10, options.timeline_bins);
  const int series_bins = std::max(10, options.series_bins);
  const double bin_ns = total / bins;
  const double series_bin_ns = total / series_bins;

  // --- engine and DMA-engine busy time per bin ---
  std::vector<std::vector<double>> engine_busy(kEngineCount,
                                               std::vector<double>(static_cast<size_t>(bins)));
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const InstructionTiming& it = t.instructions[i];
    spread(engine_busy[size_t(p.instructions[i].engine)], total, it.start_ns, it.issue_end_ns,
           it.issue_end_ns - it.start_ns);
  }
  std::vector<std::vector<double>> dma_busy(size_t(m.dma_engines),
                                            std::vector<double>(static_cast<size_t>(bins)));
  std::vector<double> gather_bytes(static_cast<size_t>(series_bins)),
      other_bytes(static_cast<size_t>(series_bins));
  const bool pieces = !t.dma_pieces.empty();
  if (pieces) {
    for (const DmaPieceTiming& piece : t.dma_pieces) {
      if (piece.engine < dma_busy.size())
        spread(dma_busy[piece.engine], total, piece.start_ns, piece.end_ns,
               piece.end_ns - piece.start_ns);
      const bool gather = p.instructions[piece.instruction].opcode == Opcode::dma_gather;
      spread(gather ? gather_bytes : other_bytes, total, piece.start_ns, piece.end_ns,
             double(piece.bytes));
    }
  } else {
    dma_busy.assign(1, std::vector<double>(static_cast<size_t>(bins)));
    for (size_t i = 0; i < p.instructions.size(); ++i) {
      const Instruction& instr = p.instructions[i];
      if (instr.dma == kNone) continue;
      const InstructionTiming& it = t.instructions[i];
      spread(dma_busy[0], total, it.transfer_start_ns, it.end_ns, it.end_ns - it.transfer_start_ns);
      spread(instr.opcode == Opcode::dma_gather ? gather_bytes : other_bytes, total,
             it.transfer_start_ns, it.end_ns, double(p.dmas[instr.dma].bytes()));
    }
  }
  for (auto& b : gather_bytes) b /= series_bin_ns;  // B/ns = GB/s
  for (auto& b : other_bytes) b /= series_bin_ns;

  // --- SBUF/PSUM occupancy: a tile counts from its first access to its last ---
  std::vector<double> first(p.buffers.size(), -1), last(p.buffers.size(), -1);
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const InstructionTiming& it = t.instructions[i];
    for (const TileRef& ref : p.instructions[i].operands) {
      if (!ref.valid()) continue;
      if (first[ref.tile] < 0 || it.start_ns < first[ref.tile]) first[ref.tile] = it.start_ns;
      last[ref.tile] = std::max(last[ref.tile], it.end_ns);
    }
  }
  std::vector<double> sbuf_live(static_cast<size_t>(series_bins)),
      psum_live(static_cast<size_t>(series_bins));
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    const Buffer& buffer = p.buffers[b];
    if (buffer.memory == Memory::hbm || first[b] < 0) continue;
    auto& live = buffer.memory == Memory::sbuf ? sbuf_live : psum_live;
    const int lo = std::clamp(static_cast<int>(first[b] / series_bin_ns), 0, series_bins - 1);
    const int hi = std::clamp(static_cast<int>(last[b] / series_bin_ns), 0, series_bins - 1);
    for (int i = lo; i <= hi; ++i) live[size_t(i)] += double(buffer.bytes_per_partition()) / 1024.0;
  }

  std::ostringstream html;
  const std::string title = options.title.empty() ? r.kernel + " on " + r.machine : options.title;
  html << "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>" << escape(title)
       << "</title><style>"
       << "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}"
       << "h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}"
       << "table{border-collapse:collapse;margin:8px 0}th,td{padding:3px 10px;border-bottom:1px "
          "solid #eee;text-align:left;font-variant-numeric:tabular-nums}th{font-weight:600}"
       << ".lbl{font-size:11px;fill:#333}.legend span{margin-right:14px;font-size:12px}"
       << ".legend i{display:inline-block;width:10px;height:10px;margin-right:4px}"
       << ".note{color:#555;font-size:12px}</style></head><body>\n";
  html << "<h1>" << escape(title) << "</h1>\n";
  if (!r.parameters.empty()) {
    html << "<p class='note'>";
    for (const auto& [k, v] : r.parameters) html << escape(k) << "=" << escape(v) << " ";
    html << "</p>\n";
  }

  // --- summary ---
  html << "<h2>Summary</h2><table id='summary'>";
  html << row("total time", fmt("%.3f us", r.total_time_ns / 1e3));
  html << row("instructions", std::to_string(r.instruction_count));
  for (const auto& e : r.engines)
    html << row(e.name + " active", fmt("%.1f%%", e.active_time_percent) + " (" +
                                        std::to_string(e.instruction_count) + " instructions)");
  html << row("DMA transfers", std::to_string(r.dma_transfer_count) + ", " +
                                   bytes_label(double(r.dma_transfer_total_bytes)));
  html << row("DMA active time", fmt("%.1f%%", r.dma_active_time_percent));
  html << row("DMA utilization while active", fmt("%.1f%% of peak", r.dma_utilization_percent) +
                                                  fmt(" (%.0f GB/s peak)", r.dma_peak_gbps));
  html << row("HBM MBU", fmt("%.1f%%", r.mbu_estimated_percent));
  html << row("TensorE HFU / MFU",
              fmt("%.1f%%", r.hfu_percent) + " / " + fmt("%.1f%%", r.mfu_percent));
  html << row("SBUF peak allocated", bytes_label(double(r.peak_sbuf_bytes_per_partition)) + " of " +
                                         bytes_label(double(r.sbuf_bytes_per_partition)) +
                                         " per partition");
  html << row("PSUM peak allocated", bytes_label(double(r.peak_psum_bytes_per_partition)) + " of " +
                                         bytes_label(double(r.psum_bytes_per_partition)) +
                                         " per partition");
  html << "</table>\n<table id='dma-kinds'><tr><th>DMA kind</th><th>transfers</th><th>bytes</th>"
          "<th>avg B/partition</th><th>engines used</th><th>GB/s while active</th>"
          "<th>% of peak</th></tr>";
  for (const auto& k : r.dma_by_kind)
    html << "<tr><td>" << escape(k.kind) << "</td><td>" << k.transfers << "</td><td>"
         << bytes_label(double(k.bytes)) << "</td><td>"
         << fmt("%.0f", k.average_bytes_per_partition) << "</td><td>" << k.engines_used << " of "
         << m.dma_engines << "</td><td>" << fmt("%.1f", k.achieved_gbps) << "</td><td>"
         << fmt("%.1f%%", k.utilization_percent) << "</td></tr>";
  html << "</table>\n";

  if (!options.comparisons.empty()) {
    html << "<h2>Comparison</h2><table id='comparison'><tr><th>metric</th><th>"
         << escape(options.baseline_label) << "</th>";
    for (const auto& c : options.comparisons) html << "<th>" << escape(c.label) << "</th>";
    html << "</tr>";
    auto compare = [&](const std::string& name, auto metric) {
      html << "<tr><th>" << escape(name) << "</th><td>" << metric(r) << "</td>";
      for (const auto& c : options.comparisons) html << "<td>" << metric(c.report) << "</td>";
      html << "</tr>";
    };
    compare("total time", [](const Report& x) { return fmt("%.3f us", x.total_time_ns / 1e3); });
    compare("DMA utilization while active",
            [](const Report& x) { return fmt("%.1f%%", x.dma_utilization_percent); });
    compare("DMA active time",
            [](const Report& x) { return fmt("%.3f us", x.dma_active_time_ns / 1e3); });
    for (const char* kind : {"dma_gather", "dma_copy"}) {
      compare(std::string(kind) + " utilization while active", [kind](const Report& x) {
        const DmaKindSummary* k = kind_of(x, kind);
        return k ? fmt("%.1f%%", k->utilization_percent) : std::string("-");
      });
      compare(std::string(kind) + " engines used / avg B per partition", [kind](const Report& x) {
        const DmaKindSummary* k = kind_of(x, kind);
        return k ? std::to_string(k->engines_used) + " / " +
                       fmt("%.0f", k->average_bytes_per_partition)
                 : std::string("-");
      });
    }
    for (size_t e = 0; e < r.engines.size(); ++e)
      compare(r.engines[e].name + " active", [e](const Report& x) {
        return e < x.engines.size() ? fmt("%.1f%%", x.engines[e].active_time_percent)
                                    : std::string("-");
      });
    html << "</table>\n";
  }

  // --- timeline ---
  html << "<h2>Engine timeline</h2><p class='note'>Busy fraction per column of "
       << fmt("%.2f us", bin_ns / 1e3)
       << "; darker = busier. Instruction queues first, then the DMA engines"
       << (pieces ? "" : " (all engines as one row: the timing did not record pieces)")
       << ".</p>\n";
  {
    std::ostringstream svg;
    const int rows = kEngineCount + static_cast<int>(dma_busy.size());
    const int height = rows * kRowHeight + 26;
    svg << "<svg id='timeline' class='chart' viewBox='0 0 " << kLabelWidth + kPlotWidth + 10 << " "
        << height << "' width='" << kLabelWidth + kPlotWidth + 10 << "' height='" << height << "'>";
    int y = 0;
    for (int e = 0; e < kEngineCount; ++e, y += kRowHeight)
      timeline_row(svg, engine_busy[size_t(e)], bin_ns, y,
                   std::string(engine_name(static_cast<Engine>(e))), kEngineColors[e],
                   t.engine_active_ns[size_t(e)], total);
    for (size_t e = 0; e < dma_busy.size(); ++e, y += kRowHeight) {
      const double busy = pieces && e < t.dma_engine_busy_ns.size() ? t.dma_engine_busy_ns[e]
                                                                    : r.dma_active_time_ns;
      timeline_row(svg, dma_busy[e], bin_ns, y, pieces ? "dma " + std::to_string(e) : "dma",
                   kDmaColor, busy, total);
    }
    time_axis(svg, y + 2, total);
    svg << "</svg>";
    html << svg.str() << "\n";
  }

  // --- DMA bandwidth ---
  html << "<h2>DMA bandwidth over time</h2><p class='note'>Bytes moved per "
       << fmt("%.2f us", series_bin_ns / 1e3) << " column, as GB/s; dashed: peak of "
       << m.dma_engines << " DMA engines.</p><div id='bandwidth'>"
       << area_chart({{"dma_gather (K/V)", kGatherColor, gather_bytes},
                      {"other transfers", kDmaColor, other_bytes}},
                     total, r.dma_peak_gbps, fmt("peak %.0f GB/s", r.dma_peak_gbps), "GB/s")
       << "</div>\n";

  // --- histogram ---
  html << "<h2>Transfers by bytes per partition</h2><p class='note'>DMA efficiency grows with the "
          "contiguous bytes per partition (under 512 B it is overhead-bound; 2-4 KiB and more "
          "approach peak).</p>";
  {
    const auto& h = r.dma_bytes_per_partition_histogram;
    uint64_t max_transfers = 1;
    double max_bytes = 1;
    for (const auto& bucket : h) {
      max_transfers = std::max(max_transfers, bucket.transfers);
      max_bytes = std::max(max_bytes, double(bucket.bytes));
    }
    const int bar = 36, gap = 18, plot = 140;
    const int width = kLabelWidth + static_cast<int>(h.size()) * (2 * bar + gap) + 20;
    std::ostringstream svg;
    svg << "<svg id='histogram' class='chart' viewBox='0 0 " << width << " " << plot + 40
        << "' width='" << width << "' height='" << plot + 40 << "'>";
    svg << "<text x='" << kLabelWidth - 6 << "' y='14' text-anchor='end' class='lbl'>"
        << "max " << max_transfers << " transfers</text><text x='" << kLabelWidth - 6
        << "' y='28' text-anchor='end' class='lbl'>max " << bytes_label(max_bytes) << "</text>";
    for (size_t i = 0; i < h.size(); ++i) {
      const int x = kLabelWidth + static_cast<int>(i) * (2 * bar + gap);
      const double h1 = plot * double(h[i].transfers) / double(max_transfers);
      const double h2 = plot * double(h[i].bytes) / max_bytes;
      svg << "<rect class='bar' x='" << x << "' y='" << fmt("%.1f", plot - h1 + 4) << "' width='"
          << bar - 2 << "' height='" << fmt("%.1f", h1) << "' fill='" << kDmaColor << "'><title>"
          << h[i].transfers << " transfers</title></rect>";
      svg << "<rect class='bar' x='" << x + bar << "' y='" << fmt("%.1f", plot - h2 + 4)
          << "' width='" << bar - 2 << "' height='" << fmt("%.1f", h2) << "' fill='" << kGatherColor
          << "'><title>" << bytes_label(double(h[i].bytes)) << "</title></rect>";
      svg << "<text x='" << x + bar << "' y='" << plot + 20 << "' text-anchor='middle' class='lbl'>"
          << bytes_label(double(h[i].bytes_per_partition_min)) << "-</text>";
      svg << "<text x='" << x + bar << "' y='" << plot + 34 << "' text-anchor='middle' class='lbl'>"
          << h[i].transfers << " tr.</text>";
    }
    svg << "</svg><div class='legend'><span><i style='background:" << kDmaColor
        << "'></i>transfers</span><span><i style='background:" << kGatherColor
        << "'></i>bytes</span></div>";
    html << svg.str() << "\n";
  }

  // --- occupancy ---
  html << "<h2>SBUF / PSUM occupancy</h2><p class='note'>KiB per partition of tiles between their "
          "first and last access; dashed: capacity. Peak allocated (static): "
       << bytes_label(double(r.peak_sbuf_bytes_per_partition)) << " SBUF, "
       << bytes_label(double(r.peak_psum_bytes_per_partition)) << " PSUM.</p><div id='sbuf'>"
       << area_chart({{"SBUF live", "#66a182", sbuf_live}}, total,
                     double(m.sbuf_bytes_per_partition) / 1024.0,
                     bytes_label(double(m.sbuf_bytes_per_partition)) + " SBUF", "KiB")
       << "</div><div id='psum'>"
       << area_chart({{"PSUM live", "#edae49", psum_live}}, total,
                     double(m.psum_bytes_per_partition) / 1024.0,
                     bytes_label(double(m.psum_bytes_per_partition)) + " PSUM", "KiB")
       << "</div>\n";

  // --- idle blame ---
  html << "<h2>Why engines sat idle</h2><table id='blame'><tr><th>engine</th><th>idle "
          "us</th><th>waited on (largest first)</th></tr>";
  for (const auto& e : r.engines) {
    html << "<tr><td>" << escape(e.name) << "</td><td>" << fmt("%.1f", e.idle_time_ns / 1e3)
         << "</td><td>";
    for (size_t i = 0; i < e.idle_blame.size() && i < 4; ++i)
      html << (i ? ", " : "") << escape(e.idle_blame[i].waited_on) << " "
           << fmt("%.1f us", e.idle_blame[i].idle_ns / 1e3);
    html << "</td></tr>";
  }
  html << "</table>\n";

  // --- source lines ---
  if (!r.by_line.empty()) {
    double total_busy = 0;
    for (const SourceLineSummary& row : r.by_line) total_busy += row.busy_total_ns();
    html << "<h2>Kernel source lines</h2><p class='note'>Each line's instructions: busy time on "
            "the engine queues (the heat column is its share of all busy time), its share of the "
            "critical path, the idle time of queues that waited on it, and DMA traffic.</p>"
            "<table id='source-lines'><tr><th>line</th><th>source</th><th>heat</th><th>instr"
            "</th><th>busy us</th><th>critical us</th><th>idle caused us</th><th>DMA KiB</th>"
            "</tr>";
    for (const SourceLineSummary& row : r.by_line) {
      const SourceLocation& src = r.sources[row.source];
      const double busy = row.busy_total_ns();
      const double share = total_busy > 0 ? busy / total_busy : 0;
      html << "<tr><td>" << escape(src.short_label()) << "</td><td><code>" << escape(src.text)
           << "</code></td><td><svg width='80' height='10'><rect width='" << fmt("%.1f", 80 * share)
           << "' height='10' fill='#d1495b'/></svg> " << fmt("%.1f%%", 100 * share) << "</td><td>"
           << row.instructions << "</td><td>" << fmt("%.1f", busy / 1e3) << "</td><td>"
           << fmt("%.1f", row.critical_path_ns / 1e3) << "</td><td>"
           << fmt("%.1f", row.idle_blamed_ns / 1e3) << "</td><td>"
           << fmt("%.1f", double(row.dma_bytes) / 1024.0) << "</td></tr>";
    }
    html << "</table>\n";
  }
  html << "<p class='note'>Generated by tilelab sim (schema " << kReportSchema << " v"
       << kReportSchemaVersion << "); self-contained, no scripts.</p></body></html>\n";
  return html.str();
}

}  // namespace tilelab::sim
