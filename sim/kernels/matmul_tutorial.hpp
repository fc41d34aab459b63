// The four kernels of the NKI matrix-multiplication tutorial (Neuron 2.20-2.26): result[M, N] =
// lhsT[K, M]^T @ rhs[K, N], rebuilt as tile programs. Published trn1 latencies for
// 4096x8192 @ 8192x8192 bf16: 51.80 / 42.96 / 22.07 / 6.97 ms (tiled / hoist_load /
// block_free / fully_optimized).
#pragma once

#include <string>

#include "sim/machine.hpp"
#include "sim/program.hpp"

namespace tilelab::sim {

enum class MatmulVariant { tiled, hoist_load, block_free, fully_optimized };

struct MatmulTutorialConfig {
  MatmulVariant variant = MatmulVariant::fully_optimized;
  int64_t m = 4096;
  int64_t k = 8192;
  int64_t n = 8192;
  DType dtype = DType::bf16;
  int load_buffers = 2;                  // rotating SBUF buffers for loads declared inside loops
  int psum_buffers = 2;                  // rotating PSUM accumulators
  Engine evict_engine = Engine::vector;  // engine of the PSUM->SBUF copies / accumulations
};

// Builds the program; throws tilelab::Error when the shape is not a multiple of the variant's
// blocking (tiled: M%128, K%128, N%512; block_free: M%256, N%1024; fully_optimized: M%2048,
// N%1024, K%1024). HBM tensors are named "lhsT" [K, M], "rhs" [K, N] and "result" [M, N].
Program build_matmul_tutorial(const Machine& machine, const MatmulTutorialConfig& config);

MatmulVariant matmul_variant_from_name(const std::string& name);
std::string matmul_variant_name(MatmulVariant variant);

}  // namespace tilelab::sim
