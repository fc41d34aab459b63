// Self-contained HTML report of a timed run: summary table, engine and DMA-engine timeline, DMA
// bandwidth over time, bytes-per-partition histogram and SBUF/PSUM occupancy, drawn as inline SVG
// (no scripts, no network). Time series are binned, so the size is bounded whatever the program.
#pragma once

#include <string>
#include <vector>

#include "program.hpp"
#include "report.hpp"
#include "timing.hpp"

namespace tilelab::sim {

// Another run of the same kernel to set beside this one (e.g. a schedule knob changed).
struct HtmlComparison {
  std::string label;  // e.g. "tiling_factor=1"
  Report report;
};

struct HtmlOptions {
  std::string title;        // default: "<kernel> on <machine>"
  int timeline_bins = 800;  // columns of the engine timeline (each a busy fraction)
  int series_bins = 400;    // points of the bandwidth and occupancy charts
  std::string baseline_label = "this run";
  std::vector<HtmlComparison> comparisons;
};

// The HTML document. Per-DMA-engine rows and the bandwidth chart use timing.dma_pieces when the
// timing recorded them (TimingOptions::record_dma_pieces), whole transfers otherwise.
// Size: O(timeline_bins x (engines + DMA engines) + series_bins), independent of the program.
std::string report_html(const Program& program, const TimingResult& timing, const Report& report,
                        const HtmlOptions& options = {});

}  // namespace tilelab::sim
