// Matrix-multiplication tutorial kernels (calibration.md section (a)); loop nests follow
// matrix_multiplication_nki_kernels.py at aws-neuron-sdk 0521004c.
#include "sim/kernels/matmul_tutorial.hpp"

#include <tilelab/error.hpp>

#include "sim/kernels/registry.hpp"

namespace tilelab::sim {
namespace {

constexpr int64_t kTileM = 128;  // gemm_stationary_fmax
constexpr int64_t kTileK = 128;  // pmax
constexpr int64_t kTileN = 512;  // gemm_moving_fmax

void require_multiple(int64_t value, int64_t of, const char* name, MatmulVariant variant) {
  TILELAB_REQUIRE(value > 0 && value % of == 0)
      << "matmul " << matmul_variant_name(variant) << ": " << name << " = " << value
      << " must be a positive multiple of " << of;
}

struct Context {
  ProgramBuilder& b;
  const MatmulTutorialConfig& c;
  Tensor lhsT, rhs, result;
};

// The result tile (tile_m, tile_n) leaves PSUM through an SBUF tile of `out_pool` and is stored.
void evict_result(Context& x, TilePool& out_pool, Tile acc, int64_t tile_m, int64_t tile_n) {
  const Tile out = x.b.next(out_pool);
  x.b.tensor_copy(x.b.view(out), x.b.view(acc), x.c.evict_engine);
  x.b.dma_copy(x.b.hbm_rows(x.result, tile_m * kTileM, kTileM, tile_n * kTileN, kTileN),
               x.b.view(out));
}

// Original tiled kernel: every iteration loads a fresh lhsT [128,128] and rhs [128,512] tile.
void build_tiled(Context& x) {
  auto& b = x.b;
  const auto& c = x.c;
  TilePool lhsT_pool = b.pool("lhsT_tile", Memory::sbuf, kTileK, kTileM, c.dtype, c.load_buffers);
  TilePool rhs_pool = b.pool("rhs_tile", Memory::sbuf, kTileK, kTileN, c.dtype, c.load_buffers);
  TilePool psum_pool =
      b.pool("res_psum", Memory::psum, kTileM, kTileN, DType::fp32, c.psum_buffers);
  TilePool out_pool = b.pool("res_sb", Memory::sbuf, kTileM, kTileN, c.dtype, 2);
  for (int64_t m = 0; m < c.m / kTileM; ++m)
    for (int64_t n = 0; n < c.n / kTileN; ++n) {
      const Tile acc = b.next(psum_pool);
      for (int64_t k = 0; k < c.k / kTileK; ++k) {
        const Tile lhsT = b.next(lhsT_pool);
        const Tile rhs = b.next(rhs_pool);
        b.dma_copy(b.view(lhsT), b.hbm_rows(x.lhsT, k * kTileK, kTileK, m * kTileM, kTileM));
        b.dma_copy(b.view(rhs), b.hbm_rows(x.rhs, k * kTileK, kTileK, n * kTileN, kTileN));
        b.matmul(b.view(acc), b.view(lhsT), b.view(rhs), k > 0);
      }
      evict_result(x, out_pool, acc, m, n);
    }
}

// Hoisted lhsT loads: a column strip of lhsT (all of K) is loaded once per m and reused for every
// n. The tutorial declares each lhsT slot 512 wide although only 128 columns are used.
void build_hoist_load(Context& x) {
  auto& b = x.b;
  const auto& c = x.c;
  const int64_t k_tiles = c.k / kTileK;
  const Tile lhsT_tiles = b.sbuf_tile("lhsT_tiles", kTileK, k_tiles * kTileN, c.dtype);
  const Tile rhs_tiles = b.sbuf_tile("rhs_tiles", kTileK, k_tiles * kTileN, c.dtype);
  TilePool psum_pool =
      b.pool("res_psum", Memory::psum, kTileM, kTileN, DType::fp32, c.psum_buffers);
  TilePool out_pool = b.pool("res_sb", Memory::sbuf, kTileM, kTileN, c.dtype, 2);
  for (int64_t m = 0; m < c.m / kTileM; ++m) {
    for (int64_t k = 0; k < k_tiles; ++k)
      b.dma_copy(b.view(lhsT_tiles, 0, kTileK, k * kTileN, kTileM),
                 b.hbm_rows(x.lhsT, k * kTileK, kTileK, m * kTileM, kTileM));
    for (int64_t n = 0; n < c.n / kTileN; ++n) {
      for (int64_t k = 0; k < k_tiles; ++k)
        b.dma_copy(b.view(rhs_tiles, 0, kTileK, k * kTileN, kTileN),
                   b.hbm_rows(x.rhs, k * kTileK, kTileK, n * kTileN, kTileN));
      const Tile acc = b.next(psum_pool);
      for (int64_t k = 0; k < k_tiles; ++k)
        b.matmul(b.view(acc), b.view(lhsT_tiles, 0, kTileK, k * kTileN, kTileM),
                 b.view(rhs_tiles, 0, kTileK, k * kTileN, kTileN), k > 0);
      evict_result(x, out_pool, acc, m, n);
    }
  }
}

// Blocked free dimensions: 2 M-tiles x 2 N-tiles share their loads.
void build_block_free(Context& x) {
  auto& b = x.b;
  const auto& c = x.c;
  constexpr int64_t kTilesM = 2, kTilesN = 2;
  const int64_t k_tiles = c.k / kTileK;
  const Tile lhsT_tiles = b.sbuf_tile("lhsT_tiles", kTileK, kTilesM * k_tiles * kTileM, c.dtype);
  const Tile rhs_tiles = b.sbuf_tile("rhs_tiles", kTileK, kTilesN * k_tiles * kTileN, c.dtype);
  TilePool psum_pool =
      b.pool("res_psum", Memory::psum, kTileM, kTileN, DType::fp32, c.psum_buffers);
  TilePool out_pool = b.pool("res_sb", Memory::sbuf, kTileM, kTileN, c.dtype, 2);
  for (int64_t m = 0; m < c.m / (kTilesM * kTileM); ++m) {
    for (int64_t bm = 0; bm < kTilesM; ++bm)
      for (int64_t k = 0; k < k_tiles; ++k)
        b.dma_copy(b.view(lhsT_tiles, 0, kTileK, (bm * k_tiles + k) * kTileM, kTileM),
                   b.hbm_rows(x.lhsT, k * kTileK, kTileK, (kTilesM * m + bm) * kTileM, kTileM));
    for (int64_t n = 0; n < c.n / (kTilesN * kTileN); ++n) {
      for (int64_t bn = 0; bn < kTilesN; ++bn)
        for (int64_t k = 0; k < k_tiles; ++k)
          b.dma_copy(b.view(rhs_tiles, 0, kTileK, (bn * k_tiles + k) * kTileN, kTileN),
                     b.hbm_rows(x.rhs, k * kTileK, kTileK, (kTilesN * n + bn) * kTileN, kTileN));
      for (int64_t bm = 0; bm < kTilesM; ++bm)
        for (int64_t bn = 0; bn < kTilesN; ++bn) {
          const Tile acc = b.next(psum_pool);
          for (int64_t k = 0; k < k_tiles; ++k)
            b.matmul(b.view(acc),
                     b.view(lhsT_tiles, 0, kTileK, (bm * k_tiles + k) * kTileM, kTileM),
                     b.view(rhs_tiles, 0, kTileK, (bn * k_tiles + k) * kTileN, kTileN), k > 0);
          evict_result(x, out_pool, acc, kTilesM * m + bm, kTilesN * n + bn);
        }
    }
  }
}

// Fully optimized: blocks of 16 M-tiles x 2 N-tiles x 8 K-tiles, 2-4 KiB per partition loads, an
// SBUF result accumulator (PSUM evicted with an add on each K block) and one store per M-tile row.
void build_fully_optimized(Context& x) {
  auto& b = x.b;
  const auto& c = x.c;
  constexpr int64_t kTilesM = 16, kTilesN = 2, kTilesK = 8;
  constexpr int64_t kBlockM = kTilesM * kTileM, kBlockN = kTilesN * kTileN,
                    kBlockK = kTilesK * kTileK;
  const int64_t blocks_m = c.m / kBlockM, blocks_n = c.n / kBlockN, blocks_k = c.k / kBlockK;
  const int64_t row_elements = kTilesM * kTilesN * kTileN;  // one M block of result_tiles
  const Tile result_tiles = b.sbuf_tile("result_tiles", kTileM, blocks_m * row_elements, c.dtype);
  TilePool rhs_pool =
      b.pool("rhs_tiles", Memory::sbuf, kTileK, kTilesK * kBlockN, c.dtype, c.load_buffers);
  TilePool lhsT_pool =
      b.pool("lhsT_tiles", Memory::sbuf, kTileK, kTilesK * kBlockM, c.dtype, c.load_buffers);
  TilePool psum_pool =
      b.pool("res_psum", Memory::psum, kTileM, kTileN, DType::fp32, c.psum_buffers);
  TilePool packed_pool = b.pool("result_packed", Memory::sbuf, kTileM, kBlockN, c.dtype, 2);
  auto result_view = [&](int64_t m, int64_t bm, int64_t bn) {
    return b.view(result_tiles, 0, kTileM, m * row_elements + (bm * kTilesN + bn) * kTileN, kTileN);
  };
  for (int64_t n = 0; n < blocks_n; ++n) {
    for (int64_t m = 0; m < blocks_m; ++m)  // nl.zeros of result_tiles
      b.memset(b.view(result_tiles, 0, kTileM, m * row_elements, row_elements), 0.0f);
    for (int64_t k = 0; k < blocks_k; ++k) {  // sequential_range
      const Tile rhs = b.next(rhs_pool);
      for (int64_t bk = 0; bk < kTilesK; ++bk)
        b.dma_copy(b.view(rhs, 0, kTileK, bk * kBlockN, kBlockN),
                   b.hbm_rows(x.rhs, (kTilesK * k + bk) * kTileK, kTileK, n * kBlockN, kBlockN));
      for (int64_t m = 0; m < blocks_m; ++m) {
        const Tile lhsT = b.next(lhsT_pool);
        for (int64_t bk = 0; bk < kTilesK; ++bk)
          b.dma_copy(b.view(lhsT, 0, kTileK, bk * kBlockM, kBlockM),
                     b.hbm_rows(x.lhsT, (kTilesK * k + bk) * kTileK, kTileK, m * kBlockM, kBlockM));
        for (int64_t bn = 0; bn < kTilesN; ++bn)
          for (int64_t bm = 0; bm < kTilesM; ++bm) {
            const Tile acc = b.next(psum_pool);
            for (int64_t bk = 0; bk < kTilesK; ++bk)
              b.matmul(b.view(acc), b.view(lhsT, 0, kTileK, bk * kBlockM + bm * kTileM, kTileM),
                       b.view(rhs, 0, kTileK, bk * kBlockN + bn * kTileN, kTileN), bk > 0);
            b.tensor_tensor(result_view(m, bm, bn), result_view(m, bm, bn), b.view(acc),
                            AluOp::add);
          }
      }
    }
    for (int64_t m = 0; m < blocks_m; ++m)
      for (int64_t bm = 0; bm < kTilesM; ++bm) {
        const Tile packed = b.next(packed_pool);
        for (int64_t bn = 0; bn < kTilesN; ++bn)
          b.tensor_copy(b.view(packed, 0, kTileM, bn * kTileN, kTileN), result_view(m, bm, bn),
                        c.evict_engine);
        b.dma_copy(b.hbm_rows(x.result, (kTilesM * m + bm) * kTileM, kTileM, n * kBlockN, kBlockN),
                   b.view(packed));
      }
  }
}

}  // namespace

MatmulVariant matmul_variant_from_name(const std::string& name) {
  if (name == "tiled") return MatmulVariant::tiled;
  if (name == "hoist_load") return MatmulVariant::hoist_load;
  if (name == "block_free") return MatmulVariant::block_free;
  if (name == "fully_optimized") return MatmulVariant::fully_optimized;
  throw Error("matmul variant '" + name +
              "': unknown; allowed: tiled, hoist_load, block_free, fully_optimized");
}

std::string matmul_variant_name(MatmulVariant variant) {
  switch (variant) {
    case MatmulVariant::tiled:
      return "tiled";
    case MatmulVariant::hoist_load:
      return "hoist_load";
    case MatmulVariant::block_free:
      return "block_free";
    case MatmulVariant::fully_optimized:
      return "fully_optimized";
  }
  return "?";
}

Program build_matmul_tutorial(const Machine& machine, const MatmulTutorialConfig& c) {
  switch (c.variant) {
    case MatmulVariant::tiled:
    case MatmulVariant::hoist_load:
      require_multiple(c.m, kTileM, "M", c.variant);
      require_multiple(c.n, kTileN, "N", c.variant);
      require_multiple(c.k, kTileK, "K", c.variant);
      break;
    case MatmulVariant::block_free:
      require_multiple(c.m, 2 * kTileM, "M", c.variant);
      require_multiple(c.n, 2 * kTileN, "N", c.variant);
      require_multiple(c.k, kTileK, "K", c.variant);
      break;
    case MatmulVariant::fully_optimized:
      require_multiple(c.m, 16 * kTileM, "M", c.variant);
      require_multiple(c.n, 2 * kTileN, "N", c.variant);
      require_multiple(c.k, 8 * kTileK, "K", c.variant);
      break;
  }
  ProgramBuilder b(machine, "matmul_" + matmul_variant_name(c.variant));
  Context x{b, c, b.hbm_tensor("lhsT", {c.k, c.m}, c.dtype),
            b.hbm_tensor("rhs", {c.k, c.n}, c.dtype), b.hbm_tensor("result", {c.m, c.n}, c.dtype)};
  switch (c.variant) {
    case MatmulVariant::tiled:
      build_tiled(x);
      break;
    case MatmulVariant::hoist_load:
      build_hoist_load(x);
      break;
    case MatmulVariant::block_free:
      build_block_free(x);
      break;
    case MatmulVariant::fully_optimized:
      build_fully_optimized(x);
      break;
  }
  return b.finish();
}

void register_matmul_tutorial(KernelRegistry& registry) {
  KernelInfo info;
  info.name = "matmul";
  info.description =
      "NKI matrix-multiplication tutorial: result[M,N] = lhsT[K,M]^T @ rhs[K,N] (4 variants; "
      "published trn1 4096x8192x8192 bf16: tiled 51.80, hoist_load 42.96, block_free 22.07, "
      "fully_optimized 6.97 ms)";
  info.default_machine = "trn1";
  info.parameters = {
      {"variant", "fully_optimized", "tiled | hoist_load | block_free | fully_optimized"},
      {"M", "4096", "rows of the result (lhsT is [K, M])"},
      {"K", "8192", "contraction size"},
      {"N", "8192", "columns of the result (rhs is [K, N])"},
      {"dtype", "bf16", "bf16 | fp16 | fp32 (inputs and result)"},
      {"load_buffers", "2", "rotating SBUF buffers for loads declared inside loops"},
      {"psum_buffers", "2", "rotating PSUM accumulators (at most 8 banks)"},
      {"evict_engine", "vector", "vector | scalar: engine of PSUM evictions"},
  };
  info.build = [](const Machine& machine, const KernelParameters& p) {
    MatmulTutorialConfig c;
    c.variant = matmul_variant_from_name(p.at("variant"));
    c.m = parameter_int(p, "M", 1, int64_t(1) << 20);
    c.k = parameter_int(p, "K", 1, int64_t(1) << 20);
    c.n = parameter_int(p, "N", 1, int64_t(1) << 20);
    c.dtype = parameter_dtype(p, "dtype");
    c.load_buffers = static_cast<int>(parameter_int(p, "load_buffers", 1, 64));
    c.psum_buffers = static_cast<int>(parameter_int(p, "psum_buffers", 1, 8));
    c.evict_engine = parameter_choice(p, "evict_engine", {"vector", "scalar"}) == "vector"
                         ? Engine::vector
                         : Engine::scalar;
    return build_matmul_tutorial(machine, c);
  };
  registry.add(std::move(info));
}

}  // namespace tilelab::sim
