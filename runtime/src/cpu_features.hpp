// What the CPU offers the kernels, decided once per process.
#pragma once

#include "tilelab/tensor.hpp"

namespace tilelab::detail {

// The instruction sets TILELAB_MAX_CPU_ISA can stop the kernels at, lowest first.
enum class CpuIsa {
  sse2,    // the x86-64 baseline: the generated kernels' last variant, the baseline loops
  avx2,    // x86-64-v3: AVX2 with FMA and F16C
  avx512,  // no limit
};

// The highest instruction set the kernels may use: TILELAB_MAX_CPU_ISA, "sse2", "avx2" or
// "avx512" (unset: avx512, everything the CPU has). The lower code paths, hand-written and
// generated, then run on CPUs that have more, to be tested and compared there (as
// ONEDNN_MAX_CPU_ISA does for oneDNN). Read once per process. Never throws (kernels ask it inside
// parallel regions): any other value caps nothing, and check_cpu_isa_setting reports it.
CpuIsa max_cpu_isa();

// Throws an Error naming TILELAB_MAX_CPU_ISA when its value is none of "sse2", "avx2" and
// "avx512". Every entry point's validation calls it before any work.
void check_cpu_isa_setting();

// x86-64-v3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE), unless capped at sse2: what the runtime's
// AVX2 code needs.
bool cpu_runs_avx2();

// AVX-512 F, BW, VL and DQ, unless capped below avx512: what the runtime's AVX-512 code needs.
bool cpu_runs_avx512();

// Runs `body()` compiled for x86-64-v3 where cpu_runs_avx2(), else compiled for the x86-64
// baseline: the runtime's loops that the compiler vectorizes, in two versions between which
// TILELAB_MAX_CPU_ISA chooses too (target_clones would choose when the library loads, out of its
// reach). `body` is an always-inline lambda, `[&]() TILELAB_ALWAYS_INLINE { ... }`, so that each
// version compiles it anew for its instruction set. (GCC 12 left an `omp simd` loop written in
// the lambda unvectorized: such a loop goes in an always-inline function the lambda calls.)
#define TILELAB_ALWAYS_INLINE __attribute__((always_inline))
template <typename Body>
__attribute__((target("arch=x86-64-v3"))) auto run_compiled_for_avx2(Body& body) {
  return body();
}
template <typename Body>
auto run_compiled_for_baseline(Body& body) {
  return body();
}
template <typename Body>
auto run_compiled_for_cpu(Body&& body) {
  return cpu_runs_avx2() ? run_compiled_for_avx2(body) : run_compiled_for_baseline(body);
}

// AVX-512 BF16 (vdpbf16ps) and VBMI (the byte permutes that widen fp8): Zen 4, Sapphire Rapids
// and later.
bool cpu_has_bf16_dot_products();

// Whether bf16 dot products outrun fp32 FMAs here, so that bf16 kernels should run on them.
// vdpbf16ps does two multiply-adds per fp32 lane: on AMD (Zen 4, Zen 5) it issues as often as an
// FMA, twice the rate. On Intel's AVX-512 BF16 cores it does not: on an Emerald Rapids Xeon
// (family 6 model 207), tilelab_machine_peak measured 173 GFLOP/s of bf16 dots against 347-354 of
// fp32 FMAs, and the bf16 forward on dot products took 1.45x as long as on fp32 FMAs (B1 H16 S512
// D128, 2 threads). By vendor, not by a timing probe: the choice changes rounding, and a result
// must not depend on how busy the machine was when the process started.
bool cpu_prefers_bf16_dot_products();

// Whether products of bf16 q (or P) with K or V of `kv_dtype` should run on bf16 dot products: on
// CPUs that prefer them, and for fp8 K/V on every CPU that has them, where widening fp8 to fp32
// for FMAs costs more than the slower dot products (the same Emerald Rapids, decode of 64
// sequences, Hq 32, Hkv 8, D 128: fp8 1.08-1.12x faster on dot products; bf16 1.03-1.05x slower).
bool bf16_dot_products_pay_off(DType kv_dtype);

// Whether a call rounds the probabilities P (and the backward's dS) to bf16 for bf16 dot
// products: bf16 q, fp32_probabilities off, and bf16_dot_products_pay_off. Every kernel
// (generated, paged, block-sparse, backward) decides by this.
bool rounds_bf16_probabilities(DType dtype, DType kv_dtype, bool fp32_probabilities);

}  // namespace tilelab::detail
