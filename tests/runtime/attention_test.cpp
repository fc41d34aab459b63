// flash_attention against the fp64 reference: a grid over dtypes, masks, GQA ratios, bias shapes,
// head dims and ragged lengths, run through every implementation; strided views; masked rows.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attention_fp64.hpp"
#include "host_tensor.hpp"
#include "tilelab/tilelab.hpp"

namespace {

using tilelab::CausalAlignment;
using tilelab::DType;
using tilelab::Implementation;
using tilelab_test::HostTensor;
using tilelab_test::Layout;
using tilelab_test::Random;

enum class Mask { none, top_left, bottom_right };
// Bias shapes, as broadcast patterns over [B, H, M, N].
enum class BiasShape { none, h_n, b_m_n, b_h_m_n, n_only, b_n };

struct Heads {
  std::int64_t q_heads, kv_heads;
};
struct Lengths {
  std::int64_t q_len, kv_len;
};

struct Case {
  DType dtype = DType::f32;
  Mask mask = Mask::none;
  Heads heads{1, 1};
  BiasShape bias = BiasShape::none;
  std::int64_t head_dim = 16;
  Lengths lengths{1, 1};
  std::int64_t batch = 1;
  std::optional<float> scale;  // default 1/sqrt(D)
  bool with_lse = true;
  // Memory layouts: q stored as [B, M, H, D] (the usual projection output); out and lse stored
  // as [B, M, H, D] and [B, M, H]; out, bias and lse with padded rows; k/v with their head dim
  // spaced out (not unit stride).
  bool q_transposed = false;
  bool out_transposed = false;
  bool out_padded = false;
  bool kv_inner_strided = false;
  bool fp32_probabilities = false;  // bf16: P kept in fp32 instead of bf16 dot products
};

const char* dtype_label(DType dtype) {
  return tilelab::dtype_name(dtype);
}
const char* mask_label(Mask mask) {
  switch (mask) {
    case Mask::none:
      return "none";
    case Mask::top_left:
      return "causal top_left";
    case Mask::bottom_right:
      return "causal bottom_right";
  }
  return "?";
}
const char* bias_label(BiasShape bias) {
  switch (bias) {
    case BiasShape::none:
      return "none";
    case BiasShape::h_n:
      return "[1,H,1,N]";
    case BiasShape::b_m_n:
      return "[B,1,M,N]";
    case BiasShape::b_h_m_n:
      return "[B,H,M,N]";
    case BiasShape::n_only:
      return "[1,1,1,N]";
    case BiasShape::b_n:
      return "[B,1,1,N]";
  }
  return "?";
}

std::string describe(const Case& c) {
  std::ostringstream text;
  text << dtype_label(c.dtype) << " B=" << c.batch << " Hq=" << c.heads.q_heads
       << " Hkv=" << c.heads.kv_heads << " M=" << c.lengths.q_len << " N=" << c.lengths.kv_len
       << " D=" << c.head_dim << " mask=" << mask_label(c.mask) << " bias=" << bias_label(c.bias)
       << " scale=" << (c.scale ? std::to_string(*c.scale) : std::string("default"))
       << (c.q_transposed ? " q[B,M,H,D]" : "") << (c.out_transposed ? " out[B,M,H,D]" : "")
       << (c.out_padded ? " out/bias/lse padded" : "")
       << (c.kv_inner_strided ? " k/v inner stride 2" : "")
       << (c.fp32_probabilities ? " fp32 probabilities" : "");
  return text.str();
}

std::vector<std::int64_t> bias_shape(const Case& c) {
  const std::int64_t b = c.batch, h = c.heads.q_heads, m = c.lengths.q_len, n = c.lengths.kv_len;
  switch (c.bias) {
    case BiasShape::h_n:
      return {1, h, 1, n};
    case BiasShape::b_m_n:
      return {b, 1, m, n};
    case BiasShape::b_h_m_n:
      return {b, h, m, n};
    case BiasShape::n_only:
      return {1, 1, 1, n};
    case BiasShape::b_n:
      return {b, 1, 1, n};
    case BiasShape::none:
      break;
  }
  return {};
}

// Tolerances from the dtype's rounding: inputs are exact in the dtype, so the differences come
// from the final rounding of out to the dtype (half an ulp: 2^-11 for f16, 2^-8 for bf16, with room
// for kernels that round P to the dtype before P·V) and from fp32 scores, whose rounding error
// (a few ulps of scale·Σ|q k| + |bias|) shifts every softmax weight by that much, relatively.
struct Tolerance {
  double out;  // relative to max(|expected|, scale of v)
  double lse;  // relative to max(1, |expected|)
};
Tolerance tolerance_for(DType dtype, double score_magnitude) {
  const double score_error = 4 * 0x1.0p-24 * score_magnitude;
  switch (dtype) {
    case DType::f16:
      return {2e-3 + score_error, 1e-3 + score_error};
    case DType::bf16:
      return {2e-2 + score_error, 1e-2 + score_error};
    default:
      return {1e-5 + score_error, 1e-6 + score_error};
  }
}

// The tensors of one case, filled with values exact in the dtype.
struct Inputs {
  HostTensor q, k, v, out;
  std::optional<HostTensor> bias;
  std::optional<HostTensor> lse;
  tilelab::FlashAttentionOptions options;
  double v_scale = 0;

  explicit Inputs(const Case& c)
      : q(c.dtype, {c.batch, c.heads.q_heads, c.lengths.q_len, c.head_dim},
          c.q_transposed ? Layout{{0, 2, 1, 3}} : Layout{}),
        k(c.dtype, {c.batch, c.heads.kv_heads, c.lengths.kv_len, c.head_dim},
          c.kv_inner_strided ? Layout{{}, 0, 2} : Layout{}),
        v(c.dtype, {c.batch, c.heads.kv_heads, c.lengths.kv_len, c.head_dim},
          c.kv_inner_strided ? Layout{{}, 0, 2} : Layout{}),
        out(c.dtype, {c.batch, c.heads.q_heads, c.lengths.q_len, c.head_dim},
            c.out_transposed ? Layout{{0, 2, 1, 3}}
            : c.out_padded   ? Layout{{}, 5, 1}
                             : Layout{}) {
    Random random(0x5eed0000u + static_cast<std::uint64_t>(c.head_dim * 131 + c.lengths.kv_len));
    // Scores of standard deviation ~1.5 after the 1/sqrt(D) scale: peaked enough that the running
    // maximum matters, flat enough that many keys contribute.
    q.fill_uniform(random, 2.5);
    k.fill_uniform(random, 1.5);
    v.fill_uniform(random, 1.0);
    v_scale = 1.0;
    if (c.bias != BiasShape::none) {
      bias.emplace(DType::f32, bias_shape(c), c.out_padded ? Layout{{}, 3, 1} : Layout{});
      bias->fill_uniform(random, 2.0);
      options.bias = bias->view();
    }
    if (c.with_lse) {
      lse.emplace(DType::f32, std::vector<std::int64_t>{c.batch, c.heads.q_heads, c.lengths.q_len},
                  c.out_transposed ? Layout{{0, 2, 1}}
                  : c.out_padded   ? Layout{{}, 3, 1}
                                   : Layout{});
      options.lse = lse->view();
    }
    options.causal = c.mask != Mask::none;
    options.causal_alignment =
        c.mask == Mask::bottom_right ? CausalAlignment::bottom_right : CausalAlignment::top_left;
    options.scale = c.scale;
    options.fp32_probabilities = c.fp32_probabilities;
  }
};

// Compares out and lse with the fp64 reference; a fully masked row must be exactly 0 / -inf.
void check_against(const Case& c, const Inputs& inputs, const tilelab_test::Fp64Attention& expected,
                   const char* implementation) {
  const Tolerance tolerance = tolerance_for(c.dtype, expected.score_magnitude);
  const std::int64_t head_dim = c.head_dim;
  std::int64_t out_failures = 0, lse_failures = 0, masked_rows = 0;
  double worst_out_ratio = 0, worst_lse_ratio = 0;
  std::string first_failure;
  for (std::int64_t row = 0; row < expected.batch * expected.q_heads * expected.q_len; ++row) {
    const double expected_lse = expected.lse[static_cast<std::size_t>(row)];
    const bool fully_masked = std::isinf(expected_lse);
    masked_rows += fully_masked;
    for (std::int64_t d = 0; d < head_dim; ++d) {
      const double want = expected.out[static_cast<std::size_t>(row * head_dim + d)];
      const double got = inputs.out.get(row * head_dim + d);
      const double allowed = tolerance.out * std::max(std::abs(want), inputs.v_scale);
      const double error = std::abs(got - want);
      const bool ok = fully_masked ? got == 0.0 : error <= allowed;  // NaN fails both
      if (!fully_masked) worst_out_ratio = std::max(worst_out_ratio, error / allowed);
      if (!ok && out_failures++ == 0) {
        first_failure = "out row " + std::to_string(row) + " d " + std::to_string(d) + ": got " +
                        std::to_string(got) + ", want " + std::to_string(want);
      }
    }
    if (inputs.lse) {
      const double got = inputs.lse->get(row);
      bool ok;
      if (fully_masked) {
        ok = std::isinf(got) && got < 0;
      } else {
        const double allowed = tolerance.lse * std::max(1.0, std::abs(expected_lse));
        ok = std::abs(got - expected_lse) <= allowed;
        worst_lse_ratio = std::max(worst_lse_ratio, std::abs(got - expected_lse) / allowed);
      }
      if (!ok && lse_failures++ == 0 && first_failure.empty()) {
        first_failure = "lse row " + std::to_string(row) + ": got " + std::to_string(got) +
                        ", want " + std::to_string(expected_lse);
      }
    }
  }
  INFO(describe(c) << " via " << implementation << ": " << masked_rows
                   << " fully masked rows, worst error / tolerance: out " << worst_out_ratio
                   << ", lse " << worst_lse_ratio << "; " << first_failure);
  CHECK(out_failures == 0);
  CHECK(lse_failures == 0);
}

// Runs `c` through the reference, the generated kernels and automatic dispatch, each checked
// against the fp64 reference.
void run_case(const Case& c) {
  Inputs inputs(c);
  const auto expected = tilelab_test::attention_fp64(inputs.q.view(), inputs.k.view(),
                                                     inputs.v.view(), inputs.options);
  const std::string chosen = tilelab::flash_attention_implementation(
      inputs.q.view(), inputs.k.view(), inputs.v.view(), inputs.out.view(), inputs.options);
  // Decode without a bias runs on the paged kernel under automatic dispatch.
  const bool decode_on_paged_kernel = c.lengths.q_len == 1 && c.bias == BiasShape::none;
  if (decode_on_paged_kernel) {
    INFO(describe(c));
    REQUIRE(chosen == "paged");
  }
  bool generated_covers = chosen == "generated";
  // A generated call names its kernel, any other names none.
  const char* kernel = tilelab::flash_attention_kernel(
      inputs.q.view(), inputs.k.view(), inputs.v.view(), inputs.out.view(), inputs.options);
  CHECK((kernel != nullptr) == generated_covers);
  if (kernel != nullptr) CHECK(std::string(kernel).rfind("flash_fwd_", 0) == 0);
#ifdef TILELAB_HAVE_KERNELS
  // Built with kernels: every case with unit innermost strides is within what they cover, so the
  // generated path cannot silently fall back to the reference.
  if (!c.kv_inner_strided) {
    INFO(describe(c));
    if (!decode_on_paged_kernel) REQUIRE(chosen == "generated");
    generated_covers = true;
  }
#endif
  std::vector<Implementation> implementations = {Implementation::reference,
                                                 Implementation::automatic};
  // Built without kernels, 'generated' throws; it is run whenever it covers the call.
  if (generated_covers) implementations.push_back(Implementation::generated);

  for (const Implementation implementation : implementations) {
    const char* name = implementation == Implementation::reference   ? "reference"
                       : implementation == Implementation::generated ? "generated"
                                                                     : "automatic";
    // Sentinel everywhere, padding included: every element must be written, padding never.
    inputs.out.fill_bytes(0x7f);
    if (inputs.lse) inputs.lse->fill_bytes(0x7f);
    const std::vector<unsigned char> sentinel = inputs.out.bytes();
    tilelab::FlashAttentionOptions options = inputs.options;
    options.implementation = implementation;
    tilelab::flash_attention(inputs.q.view(), inputs.k.view(), inputs.v.view(), inputs.out.view(),
                             options);
    check_against(c, inputs, expected, name);
    if (c.out_padded) {
      // Padding bytes: the ones the view never addresses are still the sentinel.
      const auto bytes = inputs.out.bytes();
      const std::int64_t row_bytes =
          c.head_dim * static_cast<std::int64_t>(tilelab::dtype_size(c.dtype));
      const std::int64_t pitch_bytes =
          (c.head_dim + 5) * static_cast<std::int64_t>(tilelab::dtype_size(c.dtype));
      bool padding_untouched = true;
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        if (static_cast<std::int64_t>(i) % pitch_bytes >= row_bytes && bytes[i] != sentinel[i]) {
          padding_untouched = false;
        }
      }
      INFO(describe(c) << " via " << name);
      CHECK(padding_untouched);
    }
  }
}

// Cost of the fp64 reference for a case, in multiply-adds.
double cost(const Case& c) {
  return 2.0 * c.batch * c.heads.q_heads * c.lengths.q_len * c.lengths.kv_len * c.head_dim;
}

// --- axes of the grid ----------------------------------------------------------------------------

const std::vector<DType> kDTypes = {DType::f32, DType::f16, DType::bf16};
const std::vector<Mask> kMasks = {Mask::none, Mask::top_left, Mask::bottom_right};
// GQA ratios 1, 2, 4, 8 and MQA (one kv head shared by all query heads).
const std::vector<Heads> kHeads = {{2, 2}, {4, 2}, {4, 1}, {8, 1}, {3, 1}, {16, 2}};
const std::vector<BiasShape> kBiases = {BiasShape::none,    BiasShape::h_n,    BiasShape::b_m_n,
                                        BiasShape::b_h_m_n, BiasShape::n_only, BiasShape::b_n};
const std::vector<std::int64_t> kHeadDims = {16, 32, 40, 64, 80, 96, 128, 256};
// Ragged lengths around tile sizes, cross attention both ways (M > N leaves rows fully masked
// under bottom-right alignment) and single-row decode.
const std::vector<Lengths> kLengths = {{1, 1},     {7, 7},     {17, 17},     {113, 113},
                                       {128, 128}, {203, 203}, {1023, 1023}, {1024, 1024},
                                       {7, 113},   {128, 17},  {203, 1024},  {1, 203},
                                       {1, 1024},  {64, 1},    {33, 1023}};
const std::vector<std::int64_t> kBatches = {1, 2, 3};

// Every value of every axis appears for every dtype; the other axes are drawn from a fixed seed,
// redrawn a few times when the draw is too slow for the fp64 reference (cheapest draw kept).
std::vector<Case> grid_cases() {
  std::vector<Case> cases;
  Random random(20240611);
  constexpr double kBudget = 1.2e8;  // fp64 multiply-adds per case
  const auto draw = [&](DType dtype, int fixed_axis, std::size_t fixed_value) {
    Case best;
    for (int attempt = 0; attempt < 12; ++attempt) {
      Case c;
      c.dtype = dtype;
      c.mask = kMasks[fixed_axis == 0 ? fixed_value : random.below(kMasks.size())];
      c.heads = kHeads[fixed_axis == 1 ? fixed_value : random.below(kHeads.size())];
      c.bias = kBiases[fixed_axis == 2 ? fixed_value : random.below(kBiases.size())];
      c.head_dim = kHeadDims[fixed_axis == 3 ? fixed_value : random.below(kHeadDims.size())];
      c.lengths = kLengths[fixed_axis == 4 ? fixed_value : random.below(kLengths.size())];
      c.batch = kBatches[random.below(kBatches.size())];
      c.with_lse = random.below(4) != 0;
      if (attempt == 0 || cost(c) < cost(best)) best = c;
      if (cost(best) <= kBudget) break;
    }
    cases.push_back(best);
  };
  // Two draws per value: each value meets two different combinations of the other axes.
  for (int round = 0; round < 2; ++round) {
    for (const DType dtype : kDTypes) {
      for (std::size_t i = 0; i < kMasks.size(); ++i) draw(dtype, 0, i);
      for (std::size_t i = 0; i < kHeads.size(); ++i) draw(dtype, 1, i);
      for (std::size_t i = 0; i < kBiases.size(); ++i) draw(dtype, 2, i);
      for (std::size_t i = 0; i < kHeadDims.size(); ++i) draw(dtype, 3, i);
      for (std::size_t i = 0; i < kLengths.size(); ++i) draw(dtype, 4, i);
    }
  }
  return cases;
}

}  // namespace

TEST_CASE("flash_attention: matches fp64 over dtypes, masks, GQA, bias, head dims and lengths",
          "[runtime][attention]") {
  const std::vector<Case> cases = grid_cases();
  for (const Case& c : cases) {
    SECTION(describe(c)) {
      run_case(c);
    }
  }
}

TEST_CASE("flash_attention: matches fp64 on large problems", "[runtime][attention][slow]") {
  Case c;
  c.batch = 2;
  c.heads = {8, 2};
  c.lengths = {1024, 1024};
  c.head_dim = 128;
  for (const DType dtype : kDTypes) {
    c.dtype = dtype;
    c.mask = dtype == DType::f16 ? Mask::none : Mask::bottom_right;
    c.bias = dtype == DType::bf16 ? BiasShape::b_h_m_n : BiasShape::none;
    SECTION(describe(c)) {
      run_case(c);
    }
  }
  c.dtype = DType::bf16;
  c.mask = Mask::top_left;
  c.bias = BiasShape::h_n;
  c.batch = 1;
  c.heads = {4, 4};
  c.lengths = {2048, 2048};
  c.head_dim = 64;
  SECTION(describe(c)) {
    run_case(c);
  }
}

TEST_CASE("flash_attention: bf16 with fp32 probabilities matches fp64", "[runtime][attention]") {
  // The bf16 kernels' other path: P kept in fp32 (the grid above runs the default, bf16 dot
  // products with P rounded to bf16, on CPUs that have them).
  for (const Mask mask : kMasks) {
    for (const BiasShape bias : {BiasShape::none, BiasShape::b_h_m_n}) {
      for (const std::int64_t head_dim : {33, 128}) {
        Case c;
        c.dtype = DType::bf16;
        c.mask = mask;
        c.bias = bias;
        c.heads = {4, 2};
        c.lengths = {70, 131};
        c.head_dim = head_dim;
        c.fp32_probabilities = true;
        SECTION(describe(c)) {
          run_case(c);
        }
      }
    }
  }
}

TEST_CASE("flash_attention: strided and transposed views match through automatic dispatch",
          "[runtime][attention]") {
  std::vector<Case> cases;
  for (const DType dtype : kDTypes) {
    Case c;
    c.dtype = dtype;
    c.batch = 2;
    c.heads = {4, 2};
    c.lengths = {113, 203};
    c.head_dim = 40;
    c.mask = Mask::bottom_right;
    c.bias = BiasShape::h_n;
    c.q_transposed = true;
    cases.push_back(c);
    c.q_transposed = false;
    c.out_padded = true;
    c.mask = Mask::top_left;
    cases.push_back(c);
    c.out_padded = false;
    // The generated kernels write out and lse by rows of a kv head's query heads: with a GQA
    // group, [B, M, H, D] goes through a contiguous copy; without, it is written in place.
    c.out_transposed = true;
    c.mask = Mask::bottom_right;
    cases.push_back(c);
    c.heads = {3, 3};
    c.lengths = {41, 70};
    cases.push_back(c);
    c.out_transposed = false;
    c.heads = {4, 2};
    c.lengths = {113, 203};
    c.kv_inner_strided = true;
    c.mask = Mask::none;
    c.bias = BiasShape::b_m_n;
    cases.push_back(c);
    c.q_transposed = c.out_padded = true;
    c.lengths = {1, 1023};
    c.head_dim = 96;
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    SECTION(describe(c)) {
      run_case(c);
    }
  }
}

TEST_CASE("flash_attention: large and tiny scales stay finite", "[runtime][attention]") {
  // scale 40: scores in the hundreds, exp overflows without the running max; scale 1e-3: a nearly
  // uniform softmax.
  for (const float scale : {40.0f, 1e-3f, -3.0f}) {
    for (const DType dtype : kDTypes) {
      Case c;
      c.dtype = dtype;
      c.scale = scale;
      c.heads = {2, 1};
      c.lengths = {70, 300};
      c.head_dim = 64;
      c.mask = Mask::bottom_right;
      c.bias = BiasShape::b_n;
      SECTION(describe(c)) {
        run_case(c);
      }
    }
  }
}

TEST_CASE("flash_attention: fully masked rows give out 0 and lse -inf", "[runtime][attention]") {
  // Bottom-right alignment with M > N: query i sees keys j <= i - (M - N), so the first M - N rows
  // see nothing.
  for (const DType dtype : kDTypes) {
    Case c;
    c.dtype = dtype;
    c.heads = {4, 2};
    c.lengths = {40, 9};
    c.head_dim = 32;
    c.mask = Mask::bottom_right;
    c.bias = BiasShape::b_h_m_n;
    Inputs inputs(c);
    for (const Implementation implementation :
         {Implementation::reference, Implementation::automatic}) {
      inputs.out.fill_bytes(0x7f);
      inputs.lse->fill_bytes(0x7f);
      tilelab::FlashAttentionOptions options = inputs.options;
      options.implementation = implementation;
      tilelab::flash_attention(inputs.q.view(), inputs.k.view(), inputs.v.view(), inputs.out.view(),
                               options);
      for (std::int64_t bh = 0; bh < c.batch * c.heads.q_heads; ++bh) {
        for (std::int64_t i = 0; i < c.lengths.q_len; ++i) {
          const std::int64_t row = bh * c.lengths.q_len + i;
          const bool masked = i < c.lengths.q_len - c.lengths.kv_len;
          const float lse = inputs.lse->get(row);
          INFO(describe(c) << " row " << i);
          CHECK(!std::isnan(lse));
          CHECK((masked ? (std::isinf(lse) && lse < 0) : std::isfinite(lse)));
          for (std::int64_t d = 0; d < c.head_dim; ++d) {
            const float value = inputs.out.get(row * c.head_dim + d);
            CHECK(!std::isnan(value));
            if (masked) CHECK(value == 0.0f);
          }
        }
      }
    }
  }
}

TEST_CASE("flash_attention: causal alignments agree when M == N and differ otherwise",
          "[runtime][attention]") {
  Case c;
  c.heads = {2, 2};
  c.lengths = {33, 33};
  c.head_dim = 32;
  auto output_with = [&c](Mask mask) {
    c.mask = mask;
    Inputs in(c);
    tilelab::flash_attention(in.q.view(), in.k.view(), in.v.view(), in.out.view(), in.options);
    return in.out.bytes();
  };
  CHECK(output_with(Mask::top_left) == output_with(Mask::bottom_right));
  c.lengths = {5, 12};
  CHECK(output_with(Mask::top_left) != output_with(Mask::bottom_right));
}

TEST_CASE("flash_attention: gives the same result on any number of threads",
          "[runtime][attention]") {
  Case c;
  c.heads = {4, 2};
  c.lengths = {200, 300};
  c.head_dim = 64;
  c.mask = Mask::bottom_right;
  const int threads_before = tilelab::num_threads();
  std::vector<unsigned char> first;
  for (const int threads : {1, 2, 3}) {
    tilelab::set_num_threads(threads);
    Inputs inputs(c);
    tilelab::flash_attention(inputs.q.view(), inputs.k.view(), inputs.v.view(), inputs.out.view(),
                             inputs.options);
    if (first.empty()) {
      first = inputs.out.bytes();
    } else {
      INFO(threads << " threads");
      CHECK(inputs.out.bytes() == first);
    }
  }
  tilelab::set_num_threads(threads_before);
}

TEST_CASE("flash_attention: keys biased to -inf count as masked", "[runtime][attention]") {
  // Rows whose every key carries a -inf bias behave like fully masked rows; rows with some -inf
  // keys ignore exactly those keys.
  Case c;
  c.heads = {2, 2};
  c.lengths = {6, 70};  // more than one key block of the reference and of the kernels
  c.head_dim = 16;
  c.bias = BiasShape::b_h_m_n;
  Inputs inputs(c);
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  const std::int64_t rows = c.heads.q_heads * c.lengths.q_len, keys = c.lengths.kv_len;
  for (std::int64_t row = 0; row < rows; ++row) {
    for (std::int64_t j = 0; j < keys; ++j) {
      // Row 0 of each head: all keys masked; odd rows: every third key masked.
      if (row % c.lengths.q_len == 0 || (row % 2 == 1 && j % 3 == 0)) {
        inputs.bias->set(row * keys + j, minus_infinity);
      }
    }
  }
  const auto expected = tilelab_test::attention_fp64(inputs.q.view(), inputs.k.view(),
                                                     inputs.v.view(), inputs.options);
  std::vector<Implementation> implementations = {Implementation::reference};
#ifdef TILELAB_HAVE_KERNELS
  implementations.push_back(Implementation::generated);
#endif
  for (const Implementation implementation : implementations) {
    const char* name = implementation == Implementation::reference ? "reference" : "generated";
    tilelab::FlashAttentionOptions options = inputs.options;
    options.implementation = implementation;
    tilelab::flash_attention(inputs.q.view(), inputs.k.view(), inputs.v.view(), inputs.out.view(),
                             options);
    check_against(c, inputs, expected, name);
    for (std::int64_t row = 0; row < rows; row += c.lengths.q_len) {
      INFO(name << " row " << row);
      CHECK(std::isinf(inputs.lse->get(row)));
      CHECK(inputs.out.get(row * c.head_dim) == 0.0f);
    }
  }
}

TEST_CASE("flash_attention: decode shapes (few query rows per kv head) match fp64",
          "[runtime][attention]") {
  // At most 8 rows per kv head (M · Hq/Hkv) take the decode kernels (4-row tiles, head dim in
  // the vector lanes); 5..8 rows span two tiles. Every dtype meets every mask, GQA layout and
  // query length; head dims and key lengths rotate through ragged values.
  const std::vector<Heads> heads = {{1, 1}, {2, 1}, {4, 1}, {8, 1}, {4, 4}, {32, 8}};
  const std::vector<std::int64_t> head_dims = {16, 40, 64, 128, 256};
  const std::vector<std::int64_t> kv_lens = {1, 7, 64, 65, 300};
  std::size_t rotation = 0;
  for (const DType dtype : kDTypes) {
    for (const Mask mask : kMasks) {
      for (const Heads& h : heads) {
        for (const std::int64_t q_len : {1, 2}) {
          if (q_len * (h.q_heads / h.kv_heads) > 8) continue;
          Case c;
          c.dtype = dtype;
          c.mask = mask;
          c.heads = h;
          c.lengths = {q_len, kv_lens[rotation % kv_lens.size()]};
          c.head_dim = head_dims[(rotation / 2) % head_dims.size()];
          c.batch = 1 + static_cast<std::int64_t>(rotation % 2);
          ++rotation;
          SECTION(describe(c)) {
            run_case(c);
          }
        }
      }
    }
  }
}
