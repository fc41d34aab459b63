// flash_attention_backward's bad-input errors: each rule raises tilelab::Error of the right kind,
// naming the argument, and no gradient output is written. (Shapes, dtypes and values of the
// gradients themselves are checked against fp64 in tests/python/test_flash_attention_backward.py.)
#include <catch2/catch.hpp>

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
using tilelab_test::with_dtype;
using tilelab_test::with_shape;

// A valid backward call (B=2, Hq=4, Hkv=2, M=6, N=5, D=8, fp32, a bias broadcast over heads and
// its gradient) that each test breaks in one way.
struct BackwardCall {
  static constexpr std::int64_t B = 2, Hq = 4, Hkv = 2, M = 6, N = 5, D = 8;
  HostTensor q{DType::f32, {B, Hq, M, D}}, out{DType::f32, {B, Hq, M, D}};
  HostTensor dout{DType::f32, {B, Hq, M, D}}, dq{DType::f32, {B, Hq, M, D}};
  HostTensor k{DType::f32, {B, Hkv, N, D}}, v{DType::f32, {B, Hkv, N, D}};
  HostTensor dk{DType::f32, {B, Hkv, N, D}}, dv{DType::f32, {B, Hkv, N, D}};
  HostTensor bias{DType::f32, {B, 1, M, N}}, dbias{DType::f32, {B, 1, M, N}};
  HostTensor lse{DType::f32, {B, Hq, M}};
  TensorView dout_view = dout.view(), q_view = q.view(), k_view = k.view(), v_view = v.view();
  TensorView out_view = out.view(), lse_view = lse.view();
  TensorView dq_view = dq.view(), dk_view = dk.view(), dv_view = dv.view();
  std::optional<TensorView> dbias_view = dbias.view();
  HostTensor sinks{DType::f32, {Hq}}, dsinks{DType::f32, {Hq}};
  std::optional<TensorView> dsinks_view;
  tilelab::FlashAttentionOptions options;

  // Score options instead of the bias (they do not combine), and the sinks' gradient.
  void use_sinks() {
    options.bias.reset();
    dbias_view.reset();
    options.score.sinks = sinks.view();
    dsinks_view = dsinks.view();
  }

  BackwardCall() {
    Random random(11);
    for (HostTensor* t : {&q, &k, &v, &dout, &bias}) t->fill_uniform(random, 1.0);
    options.bias = bias.view();
    tilelab::FlashAttentionOptions forward = options;
    forward.lse = lse.view();
    tilelab::flash_attention(q_view, k_view, v_view, out_view, forward);
  }

  void run() {
    tilelab::flash_attention_backward(dout_view, q_view, k_view, v_view, out_view, lse_view,
                                      dq_view, dk_view, dv_view, options, dbias_view, dsinks_view);
  }
};

// Runs `call` with every implementation; expects an Error of `kind` whose message starts with
// `argument` (and contains `also`), and every gradient output still holding its sentinel.
void expect_error(BackwardCall& call, ErrorKind kind, const std::string& argument,
                  const std::string& also = "") {
  std::vector<HostTensor*> outputs = {&call.dq, &call.dk, &call.dv, &call.dbias};
  std::vector<std::vector<unsigned char>> before;
  for (HostTensor* t : outputs) {
    t->fill_bytes(0x5a);
    before.push_back(t->bytes());
  }
  for (const auto implementation :
       {tilelab::Implementation::automatic, tilelab::Implementation::reference,
        tilelab::Implementation::generated}) {
    call.options.implementation = implementation;
    std::string message;
    bool thrown = false;
    try {
      call.run();
    } catch (const tilelab::Error& error) {
      thrown = true;
      message = error.what();
      INFO("message: " << message);
      CHECK(error.kind() == kind);
    }
    INFO("expected an error naming '" << argument << "', got: " << message);
    REQUIRE(thrown);
    CHECK(message.rfind(argument + ":", 0) == 0);
    if (!also.empty()) CHECK(message.find(also) != std::string::npos);
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) CHECK(outputs[i]->bytes() == before[i]);
}

}  // namespace

TEST_CASE("flash_attention_backward: a valid call runs with every implementation",
          "[backward][errors]") {
  BackwardCall call;
  for (const auto implementation :
       {tilelab::Implementation::automatic, tilelab::Implementation::reference
#ifdef TILELAB_HAVE_KERNELS
        ,
        tilelab::Implementation::generated
#endif
       }) {
    call.options.implementation = implementation;
    REQUIRE_NOTHROW(call.run());
  }
}

TEST_CASE("flash_attention_backward: shapes must match the forward's tensors",
          "[backward][errors]") {
  using C = BackwardCall;
  const std::vector<std::tuple<std::string, std::function<void(C&)>, std::string>> cases = {
      {"dout", [](C& c) { c.dout_view = with_shape(c.dout_view, {C::B, C::Hq, C::M - 1, C::D}); },
       "the shape of q"},
      {"dq", [](C& c) { c.dq_view = with_shape(c.dq_view, {C::B, C::Hq, C::M, C::D - 1}); },
       "the shape of q"},
      {"dk", [](C& c) { c.dk_view = with_shape(c.dk_view, {C::B, C::Hkv, C::N - 1, C::D}); },
       "the shape of k"},
      {"dv", [](C& c) { c.dv_view = with_shape(c.dv_view, {C::B, C::Hq, C::N, C::D / 2}); },
       "the shape of k"},
      {"out", [](C& c) { c.out_view = with_shape(c.out_view, {C::B, C::Hq, C::M - 1, C::D}); },
       "the shape of q"},
      {"lse", [](C& c) { c.lse_view = with_shape(c.lse_view, {C::B, C::Hq, C::M - 1}); },
       "[2, 4, 6]"},
      {"lse", [](C& c) { c.lse_view = with_shape(c.lse_view, {C::B * C::Hq * C::M}); }, "rank 3"},
      {"dbias", [](C& c) { c.dbias_view = with_shape(*c.dbias_view, {1, 1, C::M, C::N}); },
       "the shape of bias"},
  };
  for (const auto& [argument, breakage, also] : cases) {
    DYNAMIC_SECTION(argument << ": " << also) {
      BackwardCall call;
      breakage(call);
      expect_error(call, ErrorKind::invalid_value, argument, also);
    }
  }
}

TEST_CASE("flash_attention_backward: dtypes", "[backward][errors]") {
  for (const std::string argument : {"dout", "dq", "dk", "dv", "dbias", "lse"}) {
    DYNAMIC_SECTION(argument) {
      BackwardCall call;
      TensorView* views[] = {&call.dout_view, &call.dq_view,     &call.dk_view,
                             &call.dv_view,   &*call.dbias_view, &call.lse_view};
      const char* names[] = {"dout", "dq", "dk", "dv", "dbias", "lse"};
      for (int i = 0; i < 6; ++i) {
        if (argument == names[i]) *views[i] = with_dtype(*views[i], DType::bf16);
      }
      expect_error(call, ErrorKind::invalid_type, argument, "float32");
    }
  }
}

TEST_CASE("flash_attention_backward: gradients may not alias inputs or each other",
          "[backward][errors]") {
  using C = BackwardCall;
  const std::vector<std::tuple<std::string, std::function<void(C&)>, std::string>> cases = {
      {"dq", [](C& c) { c.dq_view = c.q_view; }, "disjoint from q"},
      {"dq", [](C& c) { c.dq_view = c.dout_view; }, "disjoint from dout"},
      {"dq", [](C& c) { c.dq_view = c.out_view; }, "disjoint from out"},
      {"dk", [](C& c) { c.dk_view = c.k_view; }, "disjoint from k"},
      {"dv", [](C& c) { c.dv_view = c.v_view; }, "disjoint from v"},
      {"dv", [](C& c) { c.dv_view = c.dk_view; }, "disjoint from dk"},
      {"dbias", [](C& c) { c.dbias_view = *c.options.bias; }, "disjoint from bias"},
      {"dbias", [](C& c) { c.dbias_view = with_shape(c.dq_view, {C::B, 1, C::M, C::N}); },
       "disjoint from dq"},
      {"dk",
       [](C& c) {
         const std::int64_t shape[] = {C::B, C::Hkv, C::N, C::D}, strides[] = {0, 0, C::D, 1};
         c.dk_view = TensorView(c.dk.view().data(), DType::f32, 4, shape, strides);
       },
       "distinct addresses"},
  };
  for (const auto& [argument, breakage, also] : cases) {
    DYNAMIC_SECTION(argument << ": " << also) {
      BackwardCall call;
      breakage(call);
      expect_error(call, ErrorKind::invalid_value, argument, also);
    }
  }
}

TEST_CASE("flash_attention_backward: options that do not fit the backward", "[backward][errors]") {
  SECTION("options.lse is an output of the forward only") {
    BackwardCall call;
    call.options.lse = call.lse_view;
    expect_error(call, ErrorKind::invalid_value, "options.lse");
  }
  SECTION("dbias without a bias") {
    BackwardCall call;
    call.options.bias.reset();
    expect_error(call, ErrorKind::invalid_value, "dbias", "without a bias");
  }
  SECTION("a non-finite scale") {
    BackwardCall call;
    call.options.scale = std::numeric_limits<float>::infinity();
    expect_error(call, ErrorKind::invalid_value, "scale");
  }
  SECTION("dsinks without sinks") {
    BackwardCall call;
    call.use_sinks();
    call.options.score.sinks.reset();
    expect_error(call, ErrorKind::invalid_value, "dsinks", "without sinks");
  }
  SECTION("dsinks of another shape than [Hq]") {
    BackwardCall call;
    call.use_sinks();
    call.dsinks_view = TensorView(call.dsinks.view().data(), DType::f32, {BackwardCall::Hq - 1});
    expect_error(call, ErrorKind::invalid_value, "dsinks", "expected shape [4]");
  }
  SECTION("dsinks of another dtype than float32") {
    BackwardCall call;
    call.use_sinks();
    call.dsinks_view = TensorView(call.dsinks.view().data(), DType::f16, {BackwardCall::Hq});
    expect_error(call, ErrorKind::invalid_type, "dsinks", "float32");
  }
  SECTION("dsinks over the sinks") {
    BackwardCall call;
    call.use_sinks();
    call.dsinks_view = call.sinks.view();
    expect_error(call, ErrorKind::invalid_value, "dsinks", "sinks");
  }
  SECTION("fp8 k and v") {
    BackwardCall call;
    HostTensor k8(DType::f8e4m3fn,
                  {BackwardCall::B, BackwardCall::Hkv, BackwardCall::N, BackwardCall::D});
    call.options.bias.reset();
    call.dbias_view.reset();
    call.k_view = k8.view();
    call.v_view = k8.view();
    expect_error(call, ErrorKind::invalid_type, "k", "does not take fp8");
  }
}
