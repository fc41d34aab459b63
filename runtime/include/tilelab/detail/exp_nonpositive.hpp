// e^x for x in [-87, 0], shared by the generated kernels (Halide,
// generators/flash/online_softmax.hpp) and the paged kernel's AVX-512 softmax
// (runtime/src/reference_softmax.hpp), which compute it the same way: x = n·ln2 + r with n the
// integer part of x·log2(e) (truncated, so r is in (-ln2, 0]), e^r by a polynomial (relative
// least-squares fits on [-ln2, 0]), and n added to the exponent bits (e^r >= 1/2 and n >= -125: the
// result stays normal). Largest error measured over [-87, 0] in fp32: 1.23 ulp with the degree-6
// polynomial and ln2 in two parts (Cody and Waite); 6.6e-6 relative with the degree-4 polynomial
// and ln2 in one part, for probabilities rounded to bf16 next (relative step 2^-8). Plain C++.
#pragma once

namespace tilelab::detail {

struct ExpNonpositive {
  static constexpr float kLog2E = 1.44269504088896341f;
  static constexpr float kLn2 = 0.693147180559945309f;
  // ln2 in two parts: the first has 9 significant bits, so n · kLn2High is exact for |n| <= 127.
  static constexpr float kLn2High = 0.693359375f;
  static constexpr float kLn2Low = -2.12194440e-4f;
  // Polynomials in r, highest degree first.
  static constexpr float kDegree6[] = {0.0009784227004274726f,
                                       0.007956468500196934f,
                                       0.04148856922984123f,
                                       0.1666225790977478f,
                                       0.4999947249889374f,
                                       0.9999997615814209f,
                                       1.0f};
  static constexpr float kDegree4[] = {0.029315797612071037f, 0.15936991572380066f,
                                       0.4981571137905121f, 0.9998312592506409f,
                                       0.9999973773956299f};
};

}  // namespace tilelab::detail
