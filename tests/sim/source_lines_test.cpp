// Source-line attribution: instructions carry the line a front end set, and the report's by-line
// table sums them, checked against sums over the timing computed here.
#include <map>

#include "sim/analysis.hpp"
#include "sim/report.hpp"
#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;
using Catch::Matchers::Contains;

namespace {

struct Built {
  Program program;
  uint32_t load = 0, multiply = 0, store = 0, kernel = 0;
};

// load (line 3) -> matmul (line 5, in a helper called from line 9) -> copy and store (line 7).
Built build() {
  ProgramBuilder b(trn1(), "lines");
  Built x;
  x.kernel = b.add_source({"k.py", 9, "kernel", "mm(a, b)", kNone});
  x.load = b.add_source({"k.py", 3, "kernel", "a = nl.load(x)", kNone});
  x.multiply = b.add_source({"k.py", 5, "mm", "acc += nc_matmul(a, b)", x.kernel});
  x.store = b.add_source({"k.py", 7, "kernel", "nl.store(out, acc)", kNone});
  const Tensor in = b.hbm_tensor("in", {128, 512}, DType::bf16);
  const Tensor out = b.hbm_tensor("out", {128, 512}, DType::bf16);
  const Tile a = b.sbuf_tile("a", 128, 512, DType::bf16);
  const Tile acc = b.psum_tile("acc", 128, 512, DType::fp32);
  const Tile result = b.sbuf_tile("result", 128, 512, DType::bf16);
  b.set_source(x.load);
  b.dma_copy(b.view(a), b.hbm_rows(in, 0, 128, 0, 512));
  b.set_source(x.multiply);
  for (int k = 0; k < 4; ++k) b.matmul(b.view(acc), b.view(a, 0, 128, 0, 128), b.view(a), k > 0);
  b.set_source(x.store);
  b.tensor_copy(b.view(result), b.view(acc));
  b.dma_copy(b.hbm_rows(out, 0, 128, 0, 512), b.view(result));
  b.set_source(kNone);
  b.memset(b.view(result, 0, 128, 0, 1), 0.0f);  // no line
  x.program = b.finish();
  return x;
}

}  // namespace

TEST_CASE("source lines: instructions carry the line set when they were built", "[sim][lines]") {
  const Built x = build();
  const Program& p = x.program;
  REQUIRE(p.sources.size() == 4);
  CHECK(p.sources[x.multiply].caller == x.kernel);
  std::map<uint32_t, int> count;
  for (const Instruction& i : p.instructions) ++count[i.source];
  CHECK(count[x.load] == 1);
  CHECK(count[x.multiply] == 4);
  CHECK(count[x.store] == 2);
  CHECK(count[kNone] == 1);
}

TEST_CASE("source lines: add_source interns and checks its arguments", "[sim][lines]") {
  ProgramBuilder b(trn1(), "intern");
  const uint32_t a = b.add_source({"k.py", 3, "f", "x", kNone});
  CHECK(b.add_source({"k.py", 3, "f", "other text", kNone}) == a);  // the same location
  CHECK(b.add_source({"k.py", 3, "f", "x", a}) != a);               // another caller
  CHECK_THAT(error_of([&] { b.add_source({"k.py", 0, "f", "", kNone}); }),
             Contains("line must be >= 1"));
  CHECK_THAT(error_of([&] { b.add_source({"k.py", 1, "f", "", 7}); }), Contains("caller 7"));
  CHECK_THAT(error_of([&] { b.set_source(9); }), Contains("set_source: 9 is not a source id"));
  b.set_source(a);
  CHECK(b.current_source() == a);
}

TEST_CASE("source lines: the by-line table sums the timing of each line", "[sim][lines]") {
  const Built x = build();
  const Program& p = x.program;
  const TimingResult t = simulate_timing(p);
  const Report r = make_report(p, t);
  REQUIRE(r.sources.size() == 4);
  std::map<uint32_t, const SourceLineSummary*> rows;
  for (const SourceLineSummary& row : r.by_line) rows[row.source] = &row;
  CHECK(rows.count(x.kernel) == 0);  // no instruction, no idle caused
  REQUIRE(rows.count(x.multiply) == 1);

  // Independent sums over the timing.
  std::map<uint32_t, std::map<std::string, double>> busy;
  std::map<uint32_t, uint64_t> bytes;
  for (uint32_t i = 0; i < p.instructions.size(); ++i) {
    const Instruction& instr = p.instructions[i];
    busy[instr.source][std::string(engine_name(instr.engine))] +=
        t.instructions[i].issue_end_ns - t.instructions[i].start_ns;
    if (instr.dma != kNone) bytes[instr.source] += p.dmas[instr.dma].bytes();
  }
  for (const uint32_t s : {x.load, x.multiply, x.store}) {
    INFO("source " << s);
    CHECK(rows[s]->busy_ns == busy[s]);
    CHECK(rows[s]->dma_bytes == bytes[s]);
  }
  CHECK(rows[x.load]->dma_transfers == 1);
  CHECK(rows[x.load]->dma_bytes == 128 * 512 * 2);
  CHECK(rows[x.multiply]->instructions == 4);
  CHECK(rows[x.multiply]->dma_transfers == 0);

  // The critical path's time is split over the lines (and the one unattributed memset).
  double critical = 0;
  for (const SourceLineSummary& row : r.by_line) critical += row.critical_path_ns;
  double on_path = 0;
  for (const auto& [unit, ns] : r.critical_path_ns_by_unit) on_path += ns;
  CHECK(critical <= on_path + 1e-6);
  CHECK(critical > 0.9 * on_path);

  // Idle time blamed on a line: the gaps of instructions that waited on its instructions.
  const std::vector<double> gaps = idle_before(p, t);
  std::map<uint32_t, double> blamed;
  for (uint32_t i = 0; i < p.instructions.size(); ++i)
    if (gaps[i] > 0 && t.instructions[i].wait_on != kNone)
      blamed[p.instructions[t.instructions[i].wait_on].source] += gaps[i];
  for (const auto& [s, row] : rows) CHECK(row->idle_blamed_ns == Approx(blamed[s]));
  CHECK(rows[x.load]->idle_blamed_ns > 0);  // the matmuls waited for the load

  // JSON, text and trace carry them.
  const auto j = report_json(r);
  CHECK(j["sources"].size() == 4);
  CHECK(j["sources"][x.multiply]["caller"] == x.kernel);
  CHECK(j["by_line"].size() == r.by_line.size());
  CHECK_THAT(report_text(r), Contains("by source line") && Contains("acc += nc_matmul(a, b)"));
  CHECK(chrome_trace(p, t).find("\"source\":\"k.py:5\"") != std::string::npos);
}

TEST_CASE("source lines: a program without them has an empty table", "[sim][lines]") {
  ProgramBuilder b(trn1(), "plain");
  const Tile t = b.sbuf_tile("t", 8, 8, DType::fp32);
  b.memset(b.view(t), 1.0f);
  const Program p = b.finish();
  const Report r = make_report(p, simulate_timing(p));
  CHECK(r.sources.empty());
  CHECK(r.by_line.empty());
  CHECK(report_json(r)["by_line"].empty());
  CHECK(report_text(r).find("by source line") == std::string::npos);
}
