"""The four kernels of the NKI matrix-multiplication tutorial, in the NKI language:
result[M, N] = lhsT[K, M]^T @ rhs[K, N].

Each step of the tutorial changes only where tiles are loaded and how long they are reused; the
matmuls (TILE_K x TILE_M stationary, TILE_K x TILE_N moving, one PSUM bank each) are the same.
Written with ``neuronxcc`` imports: run ``tilelab.nki.install_neuronxcc_alias()`` first, or on
a machine with the Neuron SDK, as they are.
"""

import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc import nki


@nki.jit
def matmul_tiled(lhsT, rhs):
    """Every (m, n, k) step loads its own lhsT and rhs tiles."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    TILE_M = nl.tile_size.gemm_stationary_fmax
    TILE_K = nl.tile_size.pmax
    TILE_N = nl.tile_size.gemm_moving_fmax
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            acc = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                lhsT_tile[...] = nl.load(
                    lhsT[k * TILE_K : (k + 1) * TILE_K, m * TILE_M : (m + 1) * TILE_M]
                )
                rhs_tile[...] = nl.load(
                    rhs[k * TILE_K : (k + 1) * TILE_K, n * TILE_N : (n + 1) * TILE_N]
                )
                acc += nl.matmul(lhsT_tile[...], rhs_tile[...], transpose_x=True)
            out = nl.copy(acc, dtype=result.dtype)
            nl.store(
                result[m * TILE_M : (m + 1) * TILE_M, n * TILE_N : (n + 1) * TILE_N], value=out
            )
    return result


@nki.jit
def matmul_hoist_load(lhsT, rhs):
    """A column strip of lhsT (all of K) is loaded once per m and reused for every n."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    TILE_M = nl.tile_size.gemm_stationary_fmax
    TILE_K = nl.tile_size.pmax
    TILE_N = nl.tile_size.gemm_moving_fmax
    i_lhsT = nl.mgrid[0:TILE_K, 0:TILE_M]
    i_rhs = nl.mgrid[0:TILE_K, 0:TILE_N]
    i_res = nl.mgrid[0:TILE_M, 0:TILE_N]
    for m in nl.affine_range(M // TILE_M):
        # As in the tutorial, each slot is TILE_N wide although TILE_M columns are used.
        lhsT_tiles = nl.ndarray(
            (K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=lhsT.dtype, buffer=nl.sbuf
        )
        for k in nl.affine_range(K // TILE_K):
            lhsT_tiles[k, i_lhsT.p, i_lhsT.x] = nl.load(
                lhsT[k * TILE_K + i_lhsT.p, m * TILE_M + i_lhsT.x]
            )
        for n in nl.affine_range(N // TILE_N):
            rhs_tiles = nl.ndarray(
                (K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype, buffer=nl.sbuf
            )
            for k in nl.affine_range(K // TILE_K):
                rhs_tiles[k, i_rhs.p, i_rhs.x] = nl.load(
                    rhs[k * TILE_K + i_rhs.p, n * TILE_N + i_rhs.x]
                )
            acc = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                acc[...] += nl.matmul(
                    lhsT_tiles[k, i_lhsT.p, i_lhsT.x],
                    rhs_tiles[k, i_rhs.p, i_rhs.x],
                    transpose_x=True,
                )
            out = nl.copy(acc, dtype=result.dtype)
            nl.store(result[m * TILE_M + i_res.p, n * TILE_N + i_res.x], value=out)
    return result


@nki.jit
def matmul_block_free(lhsT, rhs):
    """2 M-tiles x 2 N-tiles share their loads."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    TILE_M = nl.tile_size.gemm_stationary_fmax
    TILE_K = nl.tile_size.pmax
    TILE_N = nl.tile_size.gemm_moving_fmax
    BLOCK_TILES_M, BLOCK_TILES_N = 2, 2
    i_lhsT = nl.mgrid[0:TILE_K, 0:TILE_M]
    i_rhs = nl.mgrid[0:TILE_K, 0:TILE_N]
    i_res = nl.mgrid[0:TILE_M, 0:TILE_N]
    for m in nl.affine_range(M // (TILE_M * BLOCK_TILES_M)):
        lhsT_tiles = nl.ndarray(
            (BLOCK_TILES_M, K // TILE_K, nl.par_dim(TILE_K), TILE_M),
            dtype=lhsT.dtype,
            buffer=nl.sbuf,
        )
        for bm in nl.affine_range(BLOCK_TILES_M):
            for k in nl.affine_range(K // TILE_K):
                lhsT_tiles[bm, k, i_lhsT.p, i_lhsT.x] = nl.load(
                    lhsT[k * TILE_K + i_lhsT.p, (m * BLOCK_TILES_M + bm) * TILE_M + i_lhsT.x]
                )
        for n in nl.affine_range(N // (TILE_N * BLOCK_TILES_N)):
            rhs_tiles = nl.ndarray(
                (BLOCK_TILES_N, K // TILE_K, nl.par_dim(TILE_K), TILE_N),
                dtype=rhs.dtype,
                buffer=nl.sbuf,
            )
            for bn in nl.affine_range(BLOCK_TILES_N):
                for k in nl.affine_range(K // TILE_K):
                    rhs_tiles[bn, k, i_rhs.p, i_rhs.x] = nl.load(
                        rhs[k * TILE_K + i_rhs.p, (n * BLOCK_TILES_N + bn) * TILE_N + i_rhs.x]
                    )
            for bm in nl.affine_range(BLOCK_TILES_M):
                for bn in nl.affine_range(BLOCK_TILES_N):
                    acc = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // TILE_K):
                        acc += nl.matmul(
                            lhsT_tiles[bm, k, i_lhsT.p, i_lhsT.x],
                            rhs_tiles[bn, k, i_rhs.p, i_rhs.x],
                            transpose_x=True,
                        )
                    out = nl.copy(acc, dtype=result.dtype)
                    nl.store(
                        result[
                            (m * BLOCK_TILES_M + bm) * TILE_M + i_res.p,
                            (n * BLOCK_TILES_N + bn) * TILE_N + i_res.x,
                        ],
                        value=out,
                    )
    return result


@nki.jit
def matmul_fully_optimized(lhsT, rhs, BLOCK_TILES_M=16, BLOCK_TILES_N=2, BLOCK_TILES_K=8):
    """All three dimensions blocked; results accumulate in SBUF across K blocks and leave in
    [TILE_M, BLOCK_N] stores."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    TILE_M = nl.tile_size.gemm_stationary_fmax
    TILE_K = nl.tile_size.pmax
    TILE_N = nl.tile_size.gemm_moving_fmax
    BLOCK_M, BLOCK_N, BLOCK_K = (
        TILE_M * BLOCK_TILES_M,
        TILE_N * BLOCK_TILES_N,
        TILE_K * BLOCK_TILES_K,
    )
    assert M % BLOCK_M == 0 and N % BLOCK_N == 0 and K % BLOCK_K == 0
    for n in nl.affine_range(N // BLOCK_N):
        result_tiles = nl.zeros(
            (M // BLOCK_M, BLOCK_TILES_M, BLOCK_TILES_N, nl.par_dim(TILE_M), TILE_N),
            dtype=lhsT.dtype,
            buffer=nl.sbuf,
        )
        for k in nl.sequential_range(K // BLOCK_K):
            i_rhs = nl.mgrid[0:TILE_K, 0:BLOCK_N]
            rhs_tiles = nl.ndarray(
                (BLOCK_TILES_K, nl.par_dim(TILE_K), BLOCK_N), dtype=rhs.dtype, buffer=nl.sbuf
            )
            for bk in nl.affine_range(BLOCK_TILES_K):
                rhs_tiles[bk, i_rhs.p, i_rhs.x] = nl.load(
                    rhs[(BLOCK_TILES_K * k + bk) * TILE_K + i_rhs.p, BLOCK_N * n + i_rhs.x]
                )
            for m in nl.affine_range(M // BLOCK_M):
                i_lhsT = nl.mgrid[0:TILE_K, 0:BLOCK_M]
                lhsT_tiles = nl.ndarray(
                    (BLOCK_TILES_K, nl.par_dim(TILE_K), BLOCK_M), dtype=lhsT.dtype, buffer=nl.sbuf
                )
                for bk in nl.affine_range(BLOCK_TILES_K):
                    lhsT_tiles[bk, i_lhsT.p, i_lhsT.x] = nl.load(
                        lhsT[(BLOCK_TILES_K * k + bk) * TILE_K + i_lhsT.p, BLOCK_M * m + i_lhsT.x]
                    )
                i_l = nl.mgrid[0:TILE_K, 0:TILE_M]
                i_r = nl.mgrid[0:TILE_K, 0:TILE_N]
                i_o = nl.mgrid[0:TILE_M, 0:TILE_N]
                for bn in nl.affine_range(BLOCK_TILES_N):
                    for bm in nl.affine_range(BLOCK_TILES_M):
                        acc = nl.zeros((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(BLOCK_TILES_K):
                            acc[...] += nisa.nc_matmul(
                                lhsT_tiles[bk, i_l.p, bm * TILE_M + i_l.x],
                                rhs_tiles[bk, i_r.p, bn * TILE_N + i_r.x],
                            )
                        result_tiles[m, bm, bn, i_o.p, i_o.x] += acc[i_o.p, i_o.x]
        for m in nl.affine_range(M // BLOCK_M):
            for bm in nl.affine_range(BLOCK_TILES_M):
                i_o = nl.mgrid[0:TILE_K, 0:TILE_N]
                i_packed = nl.mgrid[0:TILE_K, 0:BLOCK_N]
                packed = nl.ndarray((TILE_K, BLOCK_N), dtype=result_tiles.dtype, buffer=nl.sbuf)
                for bn in nl.affine_range(BLOCK_TILES_N):
                    packed[i_o.p, bn * TILE_N + i_o.x] = nl.copy(
                        result_tiles[m, bm, bn, i_o.p, i_o.x]
                    )
                nl.store(
                    result[
                        (BLOCK_TILES_M * m + bm) * TILE_K + i_packed.p, BLOCK_N * n + i_packed.x
                    ],
                    value=packed[i_packed.p, i_packed.x],
                )
    return result
