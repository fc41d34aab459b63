// TensorView: construction checks, numel, contiguity, byte ranges and descriptions.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "tilelab/detail/bf16_rounding.hpp"
#include "tilelab/tilelab.hpp"

using tilelab::DType;
using tilelab::ErrorKind;
using tilelab::TensorView;

namespace {

// Runs `make` and returns the message of the tilelab::Error it throws (empty if none).
template <typename Make>
std::string error_message(Make make, ErrorKind expected_kind = ErrorKind::invalid_value) {
  try {
    make();
  } catch (const tilelab::Error& error) {
    CHECK(error.kind() == expected_kind);
    return error.what();
  }
  return {};
}

}  // namespace

TEST_CASE("tensor: dtype sizes and names", "[runtime][tensor]") {
  CHECK(tilelab::dtype_size(DType::f32) == 4);
  CHECK(tilelab::dtype_size(DType::f16) == 2);
  CHECK(tilelab::dtype_size(DType::bf16) == 2);
  CHECK(tilelab::dtype_size(DType::i32) == 4);
  CHECK(std::string(tilelab::dtype_name(DType::f32)) == "float32");
  CHECK(std::string(tilelab::dtype_name(DType::f16)) == "float16");
  CHECK(std::string(tilelab::dtype_name(DType::bf16)) == "bfloat16");
  CHECK(std::string(tilelab::dtype_name(DType::i32)) == "int32");
}

TEST_CASE("tensor: a contiguous view has row-major strides and describes itself",
          "[runtime][tensor]") {
  float data[2 * 8 * 3 * 4];
  const TensorView view(data, DType::f32, {2, 8, 3, 4});
  CHECK(view.rank() == 4);
  CHECK(view.numel() == 192);
  CHECK(view.stride(0) == 96);
  CHECK(view.stride(1) == 12);
  CHECK(view.stride(2) == 4);
  CHECK(view.stride(3) == 1);
  CHECK(view.is_contiguous());
  CHECK(view.describe() == "float32[2, 8, 3, 4] strides [96, 12, 4, 1]");
  const auto range = view.byte_range();
  CHECK(range[0] == reinterpret_cast<std::uintptr_t>(data));
  CHECK(range[1] == reinterpret_cast<std::uintptr_t>(data + 192));
}

TEST_CASE("tensor: strided views", "[runtime][tensor]") {
  std::uint16_t data[256];
  SECTION("a transposed view is not contiguous and spans the same bytes") {
    const TensorView view(data, DType::bf16, {4, 8}, {1, 4});
    CHECK_FALSE(view.is_contiguous());
    CHECK(view.describe() == "bfloat16[4, 8] strides [1, 4]");
    const auto range = view.byte_range();
    CHECK(range[1] - range[0] == 32 * 2);
  }
  SECTION("padded rows: the range ends after the last element, not the last pad") {
    const TensorView view(data, DType::f16, {3, 5}, {7, 1});
    CHECK_FALSE(view.is_contiguous());
    const auto range = view.byte_range();
    CHECK(range[0] == reinterpret_cast<std::uintptr_t>(data));
    CHECK(range[1] == reinterpret_cast<std::uintptr_t>(data + 2 * 7 + 5));
  }
  SECTION("dims of extent 1 do not affect contiguity") {
    CHECK(TensorView(data, DType::f16, {1, 4, 1, 8}, {999, 8, 12345, 1}).is_contiguous());
    CHECK_FALSE(TensorView(data, DType::f16, {2, 4, 1, 8}, {64, 8, 1, 1}).is_contiguous());
  }
  SECTION("broadcast (stride 0) views cover one row") {
    const TensorView view(data, DType::f16, {16, 8}, {0, 1});
    CHECK_FALSE(view.is_contiguous());
    CHECK(view.numel() == 128);
    const auto range = view.byte_range();
    CHECK(range[1] - range[0] == 16);
  }
  SECTION("negative strides reach below data") {
    const TensorView view(data + 100, DType::bf16, {3, 4}, {-4, 1});
    const auto range = view.byte_range();
    CHECK(range[0] == reinterpret_cast<std::uintptr_t>(data + 92));
    CHECK(range[1] == reinterpret_cast<std::uintptr_t>(data + 104));
  }
  SECTION("run-time rank from arrays") {
    const std::int64_t shape[3] = {2, 3, 4}, strides[3] = {12, 4, 1};
    const TensorView view(data, DType::i32, 3, shape, strides);
    CHECK(view.is_contiguous());
    CHECK(view.describe() == "int32[2, 3, 4] strides [12, 4, 1]");
  }
}

TEST_CASE("tensor: empty views", "[runtime][tensor]") {
  float data[4];
  const TensorView empty(data, DType::f32, {3, 0, 2});
  CHECK(empty.numel() == 0);
  CHECK(empty.is_contiguous());
  const auto range = empty.byte_range();
  CHECK(range[0] == range[1]);
  const TensorView none;
  CHECK(none.rank() == 0);
  CHECK(none.numel() == 0);
  CHECK(none.byte_range()[0] == none.byte_range()[1]);
}

TEST_CASE("tensor: invalid views are rejected naming shape or strides", "[runtime][tensor]") {
  float data[8];
  CHECK(error_message([&] { TensorView(data, DType::f32, {}); }).rfind("shape:", 0) == 0);
  CHECK(error_message([&] {
          TensorView(data, DType::f32, {1, 1, 1, 1, 1, 1, 1});
        }).rfind("shape: expected 1 to 6 dimensions, got 7", 0) == 0);
  CHECK(error_message([&] {
          TensorView(data, DType::f32, {2, -1});
        }).rfind("shape: expected non-negative extents, got [2, -1]", 0) == 0);
  CHECK(error_message([&] {
          TensorView(data, DType::f32, {2, 4}, {4});
        }).rfind("strides: expected one stride per dimension (2), got 1", 0) == 0);
  const std::int64_t shape[2] = {2, 4};
  CHECK(error_message([&] {
          TensorView(data, DType::f32, 2, shape, nullptr);
        }).rfind("strides:", 0) == 0);
  CHECK(error_message([&] {
          TensorView(data, DType::f32, 2, nullptr, shape);
        }).rfind("shape:", 0) == 0);
  CHECK(error_message([&] { TensorView(data, DType::f32, 0, shape, shape); }).rfind("shape:", 0) ==
        0);
}

TEST_CASE("tensor: views overlap when their byte ranges intersect", "[runtime][tensor]") {
  float data[32] = {};
  const TensorView first_half(data, DType::f32, {16});
  const TensorView second_half(data + 16, DType::f32, {16});
  const TensorView middle(data + 8, DType::f32, {16});
  const TensorView every_other(data, DType::f32, {16}, {2});  // reaches data[30]
  const TensorView empty(data + 4, DType::f32, {0});
  CHECK_FALSE(first_half.overlaps(second_half));
  CHECK(first_half.overlaps(middle));
  CHECK(middle.overlaps(second_half));
  CHECK(every_other.overlaps(second_half));  // by byte range, not by element
  CHECK_FALSE(empty.overlaps(first_half));
  CHECK_FALSE(first_half.overlaps(empty));
}

TEST_CASE("bf16 rounding: nearest even, overflow to infinity, NaN stays NaN", "[runtime][dtype]") {
  using tilelab::detail::round_fp32_bits_to_bf16;
  auto round = [](float x) {
    return std::bit_cast<float>(round_fp32_bits_to_bf16(std::bit_cast<std::uint32_t>(x)));
  };
  // Checked against the definition: the two bf16 neighbours of x and which is nearer (even on a
  // tie), for every 16-bit tail of a few leading patterns.
  for (const std::uint32_t head : {0x3f800000u, 0x3f810000u, 0xc2fe0000u, 0x00010000u}) {
    for (std::uint32_t tail = 0; tail < 0x10000u; tail += 0x101u) {
      const float x = std::bit_cast<float>(head | tail);
      const float below = std::bit_cast<float>(head), above = std::bit_cast<float>(head + 0x10000u);
      const double to_below = std::abs(double(x) - below), to_above = std::abs(double(x) - above);
      const bool even_below = ((head >> 16) & 1u) == 0;
      const float expected =
          to_below < to_above || (to_below == to_above && even_below) ? below : above;
      CHECK(round(x) == expected);
    }
  }
  CHECK(std::isinf(round(std::bit_cast<float>(0x7f7fffffu))));  // max fp32 rounds up to inf
  CHECK(round(INFINITY) == INFINITY);
  CHECK(round(-0.0f) == 0.0f);
  CHECK(std::signbit(round(-0.0f)));
  for (const std::uint32_t nan : {0x7f800001u, 0x7fffffffu, 0xff800001u, 0x7fc00000u}) {
    const float r = round(std::bit_cast<float>(nan));
    CHECK(std::isnan(r));
    CHECK(std::signbit(r) == ((nan >> 31) != 0));
  }
}
