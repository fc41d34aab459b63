// flash_attention's bad-input errors: each rule raises tilelab::Error of the right kind, naming the
// argument, and nothing is written.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "host_tensor.hpp"
#include "tilelab/tilelab.hpp"

namespace {

using tilelab::DType;
using tilelab::ErrorKind;
using tilelab::TensorView;
using tilelab_test::HostTensor;
using tilelab_test::Random;
using tilelab_test::with_data;
using tilelab_test::with_dtype;
using tilelab_test::with_shape;
using tilelab_test::with_stride;

// A valid call (B=2, Hq=4, Hkv=2, M=6, N=5, D=8, fp32, full bias, lse) that each test breaks in
// one way.
struct ValidCall {
  static constexpr std::int64_t B = 2, Hq = 4, Hkv = 2, M = 6, N = 5, D = 8;
  HostTensor q{DType::f32, {B, Hq, M, D}};
  HostTensor k{DType::f32, {B, Hkv, N, D}};
  HostTensor v{DType::f32, {B, Hkv, N, D}};
  HostTensor out{DType::f32, {B, Hq, M, D}};
  HostTensor bias{DType::f32, {B, Hq, M, N}};
  HostTensor lse{DType::f32, {B, Hq, M}};
  TensorView q_view = q.view(), k_view = k.view(), v_view = v.view(), out_view = out.view();
  tilelab::FlashAttentionOptions options;

  ValidCall() {
    Random random(7);
    q.fill_uniform(random, 1.0);
    k.fill_uniform(random, 1.0);
    v.fill_uniform(random, 1.0);
    bias.fill_uniform(random, 1.0);
    options.bias = bias.view();
    options.lse = lse.view();
  }
};

// The argument of `call` named `name`: q, k, v, out, bias or lse.
TensorView& argument_of(ValidCall& call, const std::string& name) {
  if (name == "q") return call.q_view;
  if (name == "k") return call.k_view;
  if (name == "v") return call.v_view;
  if (name == "out") return call.out_view;
  return name == "bias" ? *call.options.bias : *call.options.lse;
}

// Calls flash_attention with `call` as given; expects an Error of `kind` whose message names
// `argument` (and contains `also`, when given), and out and lse still holding their sentinels.
void expect_error(ValidCall& call, ErrorKind kind, const std::string& argument,
                  const std::string& also = "") {
  call.out.fill_bytes(0x5a);
  call.lse.fill_bytes(0x5a);
  const auto out_before = call.out.bytes();
  const auto lse_before = call.lse.bytes();
  for (const auto implementation :
       {tilelab::Implementation::automatic, tilelab::Implementation::reference,
        tilelab::Implementation::generated}) {
    call.options.implementation = implementation;
    std::string message;
    bool thrown = false;
    try {
      tilelab::flash_attention(call.q_view, call.k_view, call.v_view, call.out_view, call.options);
    } catch (const tilelab::Error& error) {
      thrown = true;
      message = error.what();
      INFO("message: " << message);
      CHECK(error.kind() == kind);
    }
    INFO("expected an error naming '" << argument << "', got: " << message);
    REQUIRE(thrown);
    CHECK(message.rfind(argument + ":", 0) == 0);  // the message starts with the argument
    if (!also.empty()) CHECK(message.find(also) != std::string::npos);
    // The same validation runs before dispatch reports an implementation or a kernel.
    CHECK_THROWS_AS(tilelab::flash_attention_implementation(call.q_view, call.k_view, call.v_view,
                                                            call.out_view, call.options),
                    tilelab::Error);
    CHECK_THROWS_AS(tilelab::flash_attention_kernel(call.q_view, call.k_view, call.v_view,
                                                    call.out_view, call.options),
                    tilelab::Error);
  }
  CHECK(call.out.bytes() == out_before);
  CHECK(call.lse.bytes() == lse_before);
}

}  // namespace

TEST_CASE("flash_attention errors: the valid call used below succeeds", "[runtime][errors]") {
  ValidCall call;
  CHECK_NOTHROW(
      tilelab::flash_attention(call.q_view, call.k_view, call.v_view, call.out_view, call.options));
}

TEST_CASE("flash_attention errors: ranks", "[runtime][errors]") {
  ValidCall call;
  SECTION("q") {
    call.q_view = with_shape(call.q_view, {8, 6, 8});
    expect_error(call, ErrorKind::invalid_value, "q", "rank");
  }
  SECTION("k") {
    call.k_view = with_shape(call.k_view, {2, 2, 5, 4, 2});
    expect_error(call, ErrorKind::invalid_value, "k", "rank");
  }
  SECTION("v") {
    call.v_view = with_shape(call.v_view, {20, 8});
    expect_error(call, ErrorKind::invalid_value, "v", "rank");
  }
  SECTION("out") {
    call.out_view = TensorView();
    expect_error(call, ErrorKind::invalid_value, "out", "rank");
  }
  SECTION("bias") {
    call.options.bias =
        with_shape(*call.options.bias, {ValidCall::B, ValidCall::Hq * ValidCall::M, ValidCall::N});
    expect_error(call, ErrorKind::invalid_value, "bias", "rank");
  }
  SECTION("lse") {
    call.options.lse = with_shape(*call.options.lse, {2, 4, 6, 1});
    expect_error(call, ErrorKind::invalid_value, "lse", "rank");
  }
}

TEST_CASE("flash_attention errors: dtypes", "[runtime][errors]") {
  // q of an unsupported dtype, then each other argument differing from q (bias and lse: not fp32).
  const std::tuple<const char*, DType, const char*> cases[] = {
      {"q", DType::i32, "int32"},       {"k", DType::f16, "float32"},
      {"v", DType::bf16, "float32"},    {"out", DType::f16, "float32"},
      {"bias", DType::bf16, "float32"}, {"lse", DType::f16, "float32"}};
  for (const auto& [name, dtype, also] : cases) {
    DYNAMIC_SECTION(name << " of dtype " << tilelab::dtype_name(dtype)) {
      ValidCall call;
      TensorView& argument = argument_of(call, name);
      argument = with_dtype(argument, dtype);
      expect_error(call, ErrorKind::invalid_type, name, also);
    }
  }
}

TEST_CASE("flash_attention errors: null data and negative strides", "[runtime][errors]") {
  for (const char* name : {"q", "k", "v", "out", "bias", "lse"}) {
    DYNAMIC_SECTION("null " << name) {
      ValidCall call;
      TensorView& argument = argument_of(call, name);
      argument = with_data(argument, nullptr);
      expect_error(call, ErrorKind::invalid_value, name, "null");
    }
  }
  // A negative stride in one dimension of each argument.
  const std::tuple<const char*, int, std::int64_t> strides[] = {
      {"q", 2, -ValidCall::D}, {"k", 3, -1},    {"v", 0, -1},
      {"out", 1, -1},          {"bias", 3, -1}, {"lse", 2, -1}};
  for (const auto& [name, dim, stride] : strides) {
    DYNAMIC_SECTION("negative stride in " << name) {
      ValidCall call;
      TensorView& argument = argument_of(call, name);
      argument = with_stride(argument, dim, stride);
      expect_error(call, ErrorKind::invalid_value, name, "non-negative");
    }
  }
}

TEST_CASE("flash_attention errors: shapes", "[runtime][errors]") {
  ValidCall call;
  constexpr std::int64_t B = ValidCall::B, Hq = ValidCall::Hq, Hkv = ValidCall::Hkv;
  constexpr std::int64_t M = ValidCall::M, N = ValidCall::N, D = ValidCall::D;
  SECTION("k batch differs from q") {
    call.k_view = with_shape(call.k_view, {1, Hkv, N, D});
    call.v_view = with_shape(call.v_view, {1, Hkv, N, D});
    expect_error(call, ErrorKind::invalid_value, "k", "batch");
  }
  SECTION("k head dim differs from q") {
    call.k_view = with_shape(call.k_view, {B, Hkv, N / 2, 2 * D});
    call.v_view = with_shape(call.v_view, {B, Hkv, N / 2, 2 * D});
    expect_error(call, ErrorKind::invalid_value, "k", "head dim");
  }
  SECTION("v shape differs from k") {
    call.v_view = with_shape(call.v_view, {B, Hkv, N - 1, D});
    expect_error(call, ErrorKind::invalid_value, "v", "shape of k");
  }
  SECTION("out shape differs from q") {
    call.out_view = with_shape(call.out_view, {B, Hq, M - 1, D});
    expect_error(call, ErrorKind::invalid_value, "out", "shape of q");
  }
  SECTION("q heads not a multiple of k heads") {
    HostTensor k3(DType::f32, {B, 3, N, D}), v3(DType::f32, {B, 3, N, D});
    call.k_view = k3.view();
    call.v_view = v3.view();
    expect_error(call, ErrorKind::invalid_value, "k", "must be a multiple");
    // Both head counts are named.
    try {
      tilelab::flash_attention(call.q_view, call.k_view, call.v_view, call.out_view, call.options);
    } catch (const tilelab::Error& error) {
      const std::string message = error.what();
      CHECK(message.find("q heads 4") != std::string::npos);
      CHECK(message.find("k heads 3") != std::string::npos);
    }
  }
  SECTION("no query rows") {
    call.q_view = with_shape(call.q_view, {B, Hq, 0, D});
    call.out_view = with_shape(call.out_view, {B, Hq, 0, D});
    call.options.bias.reset();
    call.options.lse.reset();
    expect_error(call, ErrorKind::invalid_value, "q", "M >= 1");
  }
  SECTION("no keys") {
    call.k_view = with_shape(call.k_view, {B, Hkv, 0, D});
    call.v_view = with_shape(call.v_view, {B, Hkv, 0, D});
    call.options.bias.reset();
    expect_error(call, ErrorKind::invalid_value, "k", "N >= 1");
  }
  SECTION("head dim 0") {
    call.q_view = with_shape(call.q_view, {B, Hq, M, 0});
    call.k_view = with_shape(call.k_view, {B, Hkv, N, 0});
    call.v_view = with_shape(call.v_view, {B, Hkv, N, 0});
    call.out_view = with_shape(call.out_view, {B, Hq, M, 0});
    expect_error(call, ErrorKind::invalid_value, "q", "[1, 256]");
  }
  SECTION("head dim above 256") {
    HostTensor q(DType::f32, {1, 1, 1, 257}), k(DType::f32, {1, 1, 1, 257}),
        v(DType::f32, {1, 1, 1, 257}), out(DType::f32, {1, 1, 1, 257});
    call.q_view = q.view();
    call.k_view = k.view();
    call.v_view = v.view();
    call.out_view = out.view();
    call.options.bias.reset();
    call.options.lse.reset();
    out.fill_bytes(0x5a);
    const auto before = out.bytes();
    expect_error(call, ErrorKind::invalid_value, "q", "[1, 256]");
    CHECK(out.bytes() == before);
  }
  SECTION("bias with a dim that neither matches nor broadcasts") {
    call.options.bias = with_shape(*call.options.bias, {B, 2, M, N});
    expect_error(call, ErrorKind::invalid_value, "bias", "got [2, 2, 6, 5]");
  }
  SECTION("bias broadcast over keys") {
    call.options.bias = with_shape(*call.options.bias, {B, Hq, M, 1});
    expect_error(call, ErrorKind::invalid_value, "bias", "|1, 5]");
  }
  SECTION("bias batch too large") {
    HostTensor bias(DType::f32, {3, 1, 1, N});
    call.options.bias = bias.view();
    expect_error(call, ErrorKind::invalid_value, "bias", "[2|1, 4|1, 6|1, 5]");
  }
  SECTION("lse shape") {
    call.options.lse = with_shape(*call.options.lse, {B, Hq, M - 1});
    expect_error(call, ErrorKind::invalid_value, "lse", "[2, 4, 6]");
  }
}

TEST_CASE("flash_attention errors: scale", "[runtime][errors]") {
  ValidCall call;
  for (const float scale :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    call.options.scale = scale;
    expect_error(call, ErrorKind::invalid_value, "scale", "finite");
  }
}

TEST_CASE("flash_attention errors: out and lse must not alias", "[runtime][errors]") {
  ValidCall call;
  SECTION("out overlapping itself (stride 0 over rows)") {
    call.out_view = with_stride(call.out_view, 2, 0);
    expect_error(call, ErrorKind::invalid_value, "out", "distinct addresses");
  }
  SECTION("out overlapping itself (heads interleaved with rows)") {
    call.out_view =
        with_stride(call.out_view, 1, ValidCall::D);  // head h row i == head h+1 row i-1
    expect_error(call, ErrorKind::invalid_value, "out", "distinct addresses");
  }
  SECTION("out is q") {
    call.out_view = call.q_view;
    expect_error(call, ErrorKind::invalid_value, "out", "disjoint from q");
  }
  // One arena holds out and the input it overlaps, so that no other allocation can be adjacent
  // to either and be reported first.
  HostTensor arena(DType::f32, {2048});
  float* const arena_data = static_cast<float*>(arena.view().data());
  SECTION("out overlaps k") {
    call.k_view = with_data(call.k_view, arena_data);
    call.out_view = with_data(call.out_view, arena_data + 3);
    expect_error(call, ErrorKind::invalid_value, "out", "disjoint from k");
  }
  SECTION("out overlaps v") {
    call.v_view = with_data(call.v_view, arena_data + 400);
    call.out_view = with_data(call.out_view, arena_data + 100);
    expect_error(call, ErrorKind::invalid_value, "out", "disjoint from v");
  }
  SECTION("out overlaps bias") {
    call.options.bias = with_data(*call.options.bias, arena_data);
    call.out_view = with_data(call.out_view, arena_data + 239);
    expect_error(call, ErrorKind::invalid_value, "out", "disjoint from bias");
  }
  SECTION("out overlaps lse") {
    call.options.lse = with_data(*call.options.lse, static_cast<float*>(call.out_view.data()) + 1);
    // lse lives inside out here; out must stay untouched, so check that by hand.
    call.out.fill_bytes(0x5a);
    const auto before = call.out.bytes();
    CHECK_THROWS_AS(tilelab::flash_attention(call.q_view, call.k_view, call.v_view, call.out_view,
                                             call.options),
                    tilelab::Error);
    try {
      tilelab::flash_attention(call.q_view, call.k_view, call.v_view, call.out_view, call.options);
    } catch (const tilelab::Error& error) {
      CHECK(std::string(error.what()).rfind("out: expected memory disjoint from lse", 0) == 0);
    }
    CHECK(call.out.bytes() == before);
  }
  SECTION("lse overlapping itself") {
    call.options.lse = with_stride(*call.options.lse, 1, 0);
    expect_error(call, ErrorKind::invalid_value, "lse", "distinct addresses");
  }
  SECTION("lse overlaps q") {
    call.options.lse = with_data(*call.options.lse, call.q_view.data());
    expect_error(call, ErrorKind::invalid_value, "lse", "disjoint from q");
  }
  SECTION("lse overlaps bias") {
    call.options.lse = with_data(*call.options.lse, call.options.bias->data());
    expect_error(call, ErrorKind::invalid_value, "lse", "disjoint from bias");
  }
}

TEST_CASE("flash_attention errors: inputs may alias each other", "[runtime][errors]") {
  // Reading the same memory twice is fine (self-attention with k == v, or q == k).
  ValidCall call;
  call.v_view = call.k_view;
  CHECK_NOTHROW(
      tilelab::flash_attention(call.q_view, call.k_view, call.v_view, call.out_view, call.options));
  // Broadcast input views (stride 0) are fine too: only outputs must not alias.
  call.k_view = with_stride(call.k_view, 0, 0);
  CHECK_NOTHROW(
      tilelab::flash_attention(call.q_view, call.k_view, call.v_view, call.out_view, call.options));
}

TEST_CASE("flash_attention errors: 'generated' outside what the kernels cover",
          "[runtime][errors]") {
  // Innermost stride 2 is outside the generated kernels (and without kernels nothing is covered);
  // automatic falls back to the reference.
  HostTensor q(DType::f32, {1, 2, 4, 8}, tilelab_test::Layout{{}, 0, 2});
  HostTensor k(DType::f32, {1, 2, 4, 8}), v(DType::f32, {1, 2, 4, 8}),
      out(DType::f32, {1, 2, 4, 8});
  Random random(3);
  q.fill_uniform(random, 1.0);
  k.fill_uniform(random, 1.0);
  v.fill_uniform(random, 1.0);
  out.fill_bytes(0x5a);
  const auto before = out.bytes();
  tilelab::FlashAttentionOptions options;
  options.implementation = tilelab::Implementation::generated;
  try {
    tilelab::flash_attention(q.view(), k.view(), v.view(), out.view(), options);
    FAIL("expected an error");
  } catch (const tilelab::Error& error) {
    CHECK(error.kind() == ErrorKind::invalid_value);
    CHECK(std::string(error.what()).rfind("implementation:", 0) == 0);
  }
  CHECK(out.bytes() == before);
  CHECK(std::string(tilelab::flash_attention_implementation(q.view(), k.view(), v.view(),
                                                            out.view())) == "reference");
  options.implementation = tilelab::Implementation::automatic;
  CHECK_NOTHROW(tilelab::flash_attention(q.view(), k.view(), v.view(), out.view(), options));
}
