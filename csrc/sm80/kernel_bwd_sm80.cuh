// The sm80 backward main kernel (FA2's recomputing backward, written with mma.sync).
// One CTA per (key block, query head, batch): K and V stay in smem, dK / dV accumulate in
// registers over the query blocks that see the key block; Q, dO, LSE and D stream through a
// 2-stage cp.async pipeline. Warps compute S^T = K Q^T and dP^T = V dO^T (key rows x query
// cols), the transposes dV += P^T dO and dK += dS^T Q need as A operands: straight from
// registers when a warp owns whole key rows (Tile::kPInRegs), else through smem as in FA2.
// dQ += dS K reads dS^T from smem and adds into the fp32 workspace with atomics.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include "../common/block_sparse_tiles.cuh"
#include "../common/dropout_lanes.cuh"
#include "../common/mask.h"
#include "../common/params.h"
#include "../common/seqlen.h"
#include "bwd_order_sm80.h"
#include "kernel_bwd_aux_sm80.cuh"
#include "primitives_bwd_sm80.cuh"
#include "tile_bwd_sm80.h"

namespace flashattn::sm80 {

namespace bwd_detail {

constexpr float kLog2e = 1.4426950408889634f;

// sm_90 code spreads the dQ REDs over the dK GEMM (bwd_main_kernel). The sm_80 code (A100,
// and what sm_86 / sm_89 run) keeps them in one burst: spread, it spilled (d192 28 -> 216 B).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kSpreadDqReds = false;
#else
constexpr bool kSpreadDqReds = true;
#endif

using bwd_order::contributor_rank;
using bwd_order::m_range;
using bwd_order::chunked_rotated_rank;

// How kThreads threads cover a kRows x kCols tile in 16-byte chunks: kUniform when each pass
// covers whole rows (a multiple of 8, so the swizzle is the same on every pass).
template <int kRows, int kCols, int kThreads>
struct CopyShape {
  static constexpr int kChunksPerRow = kCols / 8;
  static constexpr int kChunks = kRows * kChunksPerRow;
  static constexpr bool kUniform = kThreads % kChunksPerRow == 0 && kChunks % kThreads == 0 &&
                                   (kThreads / kChunksPerRow) % 8 == 0;
  static constexpr int kPasses = (kChunks + kThreads - 1) / kThreads;
};

// kRows x kCols tile from global (row stride in elements) into swizzled smem; rows >=
// rows_valid and columns >= cols_valid read as zero. cp.async when `aligned`, else
// synchronous scalar loads (2-byte-aligned inputs, head dims with a tail). When the CTA
// covers whole rows per pass (kThreads a multiple of the chunks per row) each thread keeps
// one column and steps its row by a constant: one pointer and one smem offset, not one
// per pass (this runs in the main loop, where registers are short).
template <int kRows, int kCols, int kThreads, typename Element>
__device__ __forceinline__ void load_tile(Element* smem, const Element* gmem, int64_t row_stride,
                                          int rows_valid, int cols_valid, bool aligned,
                                          int tid) {
  using S = CopyShape<kRows, kCols, kThreads>;
  constexpr int kChunksPerRow = S::kChunksPerRow, kChunks = S::kChunks, kPasses = S::kPasses;
  constexpr bool kUniform = S::kUniform;
  // `aligned` is tested once, outside the per-chunk loops: a branch per chunk splits the
  // issue of the cp.async into basic blocks (it runs in the main loop).
  auto body = [&](auto kAligned) {
    auto copy = [&](Element* dst, const Element* src, int nvalid) {
      if constexpr (decltype(kAligned)::value) {
        cp_async_16_n(smem_u32(dst), src, nvalid * 2);
      } else {
        uint4 raw;
        uint16_t* e = reinterpret_cast<uint16_t*>(&raw);
        const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = i < nvalid ? s16[i] : uint16_t(0);
        *reinterpret_cast<uint4*>(dst) = raw;
      }
    };
    if constexpr (kUniform) {
      constexpr int kRowStep = kThreads / kChunksPerRow;  // multiple of 8: swizzle unchanged
      const int r0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
      int ncol = cols_valid - col;
      ncol = ncol < 0 ? 0 : (ncol > 8 ? 8 : ncol);
      Element* dst = smem + swz<kCols>(r0, col);
      const Element* src = gmem + r0 * row_stride + col;
      const int64_t step = kRowStep * row_stride;
#pragma unroll
      for (int it = 0; it < kPasses; ++it) {
        const bool valid = r0 + it * kRowStep < rows_valid && ncol > 0;
        copy(dst + it * kRowStep * kCols, valid ? src : gmem, valid ? ncol : 0);
        src += step;
      }
    } else {
#pragma unroll
      for (int it = 0; it < kPasses; ++it) {
        const int idx = tid + it * kThreads;
        if (kChunks % kThreads != 0 && idx >= kChunks) break;
        const int r = idx / kChunksPerRow, col = (idx % kChunksPerRow) * 8;
        int nvalid = r < rows_valid ? cols_valid - col : 0;
        nvalid = nvalid < 0 ? 0 : (nvalid > 8 ? 8 : nvalid);
        copy(smem + swz<kCols>(r, col), nvalid > 0 ? gmem + r * row_stride + col : gmem, nvalid);
      }
    }
  };
  if (aligned)
    body(std::true_type{});
  else
    body(std::false_type{});
}

// load_tile for a tile known to be whole (every row and column valid, 16-byte aligned): a
// plain cp.async per chunk, no zero-fill bookkeeping (about 12 instructions less per chunk
// in the main loop, where Q and dO are loaded every step).
template <int kRows, int kCols, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_full(Element* smem, const Element* gmem,
                                               int64_t row_stride, int tid) {
  using S = CopyShape<kRows, kCols, kThreads>;
  constexpr int kChunksPerRow = S::kChunksPerRow, kChunks = S::kChunks, kPasses = S::kPasses;
  constexpr bool kUniform = S::kUniform;
  if constexpr (kUniform) {
    constexpr int kRowStep = kThreads / kChunksPerRow;
    const int r0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
    const uint32_t dst = smem_u32(smem + swz<kCols>(r0, col));
    const Element* src = gmem + r0 * row_stride + col;
    const int64_t step = kRowStep * row_stride;
#pragma unroll
    for (int it = 0; it < kPasses; ++it) {
      cp_async_16(dst + it * kRowStep * kCols * 2, src);
      src += step;
    }
  } else {
#pragma unroll
    for (int it = 0; it < kPasses; ++it) {
      const int idx = tid + it * kThreads;
      if (kChunks % kThreads != 0 && idx >= kChunks) break;
      const int r = idx / kChunksPerRow, col = (idx % kChunksPerRow) * 8;
      cp_async_16(smem_u32(smem + swz<kCols>(r, col)), gmem + r * row_stride + col);
    }
  }
}

// Stores a warp's fp32 accumulator tile (rows x cols, C-fragment layout) as Element rows.
template <int kMT, int kNT, typename Element>
__device__ __forceinline__ void store_acc(const float (&acc)[kMT][kNT][4], Element* gmem,
                                          int64_t row_stride, int row0, int col0,
                                          int rows_valid, int cols_valid, float scale,
                                          bool pair_ok, int lane) {
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + mi * 16 + lane / 4 + half * 8;
      if (r >= rows_valid) continue;
      Element* row = gmem + r * row_stride;
#pragma unroll
      for (int ni = 0; ni < kNT; ++ni) {
        const int c = col0 + ni * 8 + (lane % 4) * 2;
        const float v0 = acc[mi][ni][half * 2] * scale, v1 = acc[mi][ni][half * 2 + 1] * scale;
        if (pair_ok && c + 1 < cols_valid) {
          *reinterpret_cast<uint32_t*>(row + c) = pack2<Element>(v0, v1);
        } else {
          if (c < cols_valid) row[c] = from_float<Element>(v0);
          if (c + 1 < cols_valid) row[c + 1] = from_float<Element>(v1);
        }
      }
    }
}

// Adds a warp's accumulator tile (times scale) into an fp32 buffer of row_stride floats per
// row. Row checks only when the tile crosses rows_valid (a branch per row otherwise).
template <int kMT, int kNT>
__device__ __forceinline__ void red_acc(const float (&acc)[kMT][kNT][4], float* gmem,
                                        int64_t row_stride, int row0, int col0, int rows_valid,
                                        float scale, int lane) {
  auto body = [&](auto kChecked) {
    float* base = gmem + (row0 + lane / 4) * row_stride + col0 + (lane % 4) * 2;
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int dr = (2 * mi + half) * 8;  // this row's offset from the lane's first row
        if (decltype(kChecked)::value && row0 + lane / 4 + dr >= rows_valid) continue;
        float* row = base + dr * row_stride;
#pragma unroll
        for (int ni = 0; ni < kNT; ++ni)
          red_add_f32x2(row + ni * 8, acc[mi][ni][half * 2] * scale,
                        acc[mi][ni][half * 2 + 1] * scale);
      }
  };
  if (row0 + kMT * 16 <= rows_valid)
    body(std::false_type{});
  else
    body(std::true_type{});
}

// Has_dropout (params.h): P and dS under the forward's Z; such a kernel takes the softcap as a
// run-time switch (one instantiation for both).
// Is_sparse: block-sparse (params.h: q_num_blocks / q_indices, the transposed view); the key
// tile lies in one mask key block (block_n a multiple of kBlockN) and visits the kernel query
// blocks of its kept mask query blocks (block_m a multiple of kBlockM) within its visible
// range, listed in shared memory past the tiles (list_cap entries) by warp 0; not
// deterministic, no rotation (the host sees to both); softcap a run-time switch.
// Block sizes that do not nest take the unit path (a run-time switch, as the forward's):
// warp 0 ORs a 64-bit keep mask per kernel query tile (bit 8 * key unit + query unit, units
// of 16 x 16) from the kept mask blocks of the key tile's units, lists the tiles whose mask
// is not empty, and P and dS are zeroed on the dropped units of a partial tile (list_cap
// ints, then list_cap uint64 masks, 8-byte aligned).
template <typename Tile, typename Element, bool Has_softcap, bool Has_dropout = false,
          bool Is_sparse = false>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    bwd_main_kernel(const __grid_constant__ BwdArgs args, const int list_cap = 0) {
  constexpr int kD = Tile::kHeadDim, kBM = Tile::kBlockM, kBN = Tile::kBlockN;
  constexpr int kThreads = Tile::kThreads;
  // Per-warp fragment counts: SdP tile (kTileNSdP x kTileMSdP), dKV, dQ.
  constexpr int kMT1 = Tile::kTileNSdP / 16, kNT1 = Tile::kTileMSdP / 8;
  constexpr int kMT2 = Tile::kTileNdKV / 16, kNT2 = Tile::kTileDdKV / 8;
  constexpr int kMT3 = Tile::kTileMdQ / 16, kNT3 = Tile::kTileDdQ / 8;
  // dQ REDs spread over the dK GEMM: smem path (dK after the dQ GEMM) on sm_90 code only.
  constexpr bool kSpread = kSpreadDqReds && !Tile::kPInRegs;
  // d128: the dQ GEMM first, its REDs spread over the dV and dK GEMMs (H200 A/B: +1-2%;
  // d64 lost 1-2%, so there only dK's GEMM carries them, after dV's and dQ's).
  constexpr bool kDqFirst = kSpread && kD == 128;
  // Steps of the dV / dK GEMMs (2 * kMT2 MMAs each) and dQ REDs per thread (see red_step).
  constexpr int kDkvSteps = (kBM / 16) * (kNT2 / 2), kDqReds = kMT3 * 2 * kNT3;
  constexpr int kRedSteps = kDqFirst ? 2 * kDkvSteps : kDkvSteps;
  static_assert(!Tile::kPInRegs || (kMT1 == kMT2 && kNT1 * 8 == kBM),
                "registers path: the SdP and dKV warp tiles cover the same key rows");

  const BwdParams& p = args.p;
  // Deterministic + right-bounded window: key blocks run in descending order (see
  // contributor_rank), so the grid is walked backwards too: a CTA only ever waits on CTAs
  // with lower linear indices, which the hardware has launched before it.
  const bool descending = args.dq_sem != nullptr && p.window_right >= 0;
  int n_block, h, b;
  if (args.heavy_first) {
    // Causal, not deterministic: key block n sees the most query blocks at n = 0; launch
    // every head's block 0, then every head's block 1, ...
    const GridCoord c = x_slowest_coord();
    n_block = c.x_rank;
    h = c.y;
    b = c.z;
  } else {
    n_block = descending ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    h = blockIdx.y;
    b = blockIdx.z;
  }
  const SeqInfo si = seq_info_clamped(p, b);
  const int sq = si.seqlen_q, sk = si.seqlen_k;
  const int n0 = n_block * kBN;
  if (n0 >= sk) return;  // varlen: this key block lies past the sequence (no rows to own)

  extern __shared__ __align__(128) uint4 smem_u4[];
  Element* sQ = reinterpret_cast<Element*>(smem_u4);
  Element* sdO = sQ + Tile::kSmemQ;
  Element* sK = sdO + Tile::kSmemdO;
  Element* sV = sK + Tile::kSmemK;
  Element* sdS = sV + Tile::kSmemV;
  Element* sP = sdS + Tile::kSmemdS;  // unused (size 0) when P stays in registers
  float* sLse = reinterpret_cast<float*>(sP + Tile::kSmemP);
  float* sDsum = sLse + Tile::kStages * kBM;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int hk = h / args.group;
  const MaskInfo mi{sq, sk, p.window_left, p.window_right, pos_shift_of(p, b)};
  const int m_blocks = (sq + kBM - 1) / kBM;
  const bwd_order::BlockRange mr = m_range<kBM, kBN>(mi, n_block, m_blocks);
  const int m_begin = mr.first, m_end = mr.second;
  // Visiting order: m_begin, m_begin + 1, ... or, without a window (every key block sees
  // every query block), rotated to start at n_block: CTAs of one head then add into
  // different dQ rows at any time instead of all into the same ones.
  int m_len = m_end - m_begin;
  const bwd_order::Chunk chunk =
      bwd_order::rotation_chunk(n_block, (sk + kBN - 1) / kBN, args.rot_chunk);
  const int m_rot = (args.rotate && m_len > 0) ? (n_block - chunk.start) % m_len : 0;
  int* sparse_list = reinterpret_cast<int*>(reinterpret_cast<unsigned char*>(smem_u4) +
                                            Tile::kSmemBytes);
  // Block-sparse: warp 0 lists the visited query tiles (block_sparse_tiles.cuh); block sizes
  // that do not nest take the unit path, a 64-bit unit mask per query tile past the list.
  const bool unit_mode = Is_sparse && (p.block_m % kBM != 0 || p.block_n % kBN != 0);
  unsigned long long* unit_masks = reinterpret_cast<unsigned long long*>(
      reinterpret_cast<unsigned char*>(smem_u4) + Tile::kSmemBytes + ((4 * list_cap + 7) & ~7));
  if constexpr (Is_sparse) {
    __shared__ int sparse_count;
    if (warp == 0) {
      const SparseAxes axes{p.q_num_blocks, p.q_indices,
                            b * p.bs_t_batch_stride + h * p.bs_t_head_stride,
                            p.n_kblocks, p.n_qblocks, p.block_n, p.block_m};
      const int cnt = build_sparse_tiles<kBN, kBM>(axes, n0, sk, m_begin, m_end, sparse_list,
                                                   unit_mode ? unit_masks : nullptr, list_cap,
                                                   lane);
      if (lane == 0) sparse_count = min(cnt, list_cap);
    }
    __syncthreads();
    m_len = sparse_count;
  }
  auto m_at = [&](int k) {
    if constexpr (Is_sparse) return sparse_list[k];
    const int r = k + m_rot;
    return m_begin + (r >= m_len ? r - m_len : r);
  };

  const Element* q_g = static_cast<const Element*>(p.q_ptr) + b * p.q_batch_stride +
                       si.q_row0 * p.q_row_stride + h * p.q_head_stride;
  const Element* do_g = static_cast<const Element*>(p.do_ptr) + b * p.do_batch_stride +
                        si.q_row0 * p.do_row_stride + h * p.do_head_stride;
  const Element* k_g = static_cast<const Element*>(p.k_ptr) + b * p.k_batch_stride +
                       (si.k_row0 + n0) * p.k_row_stride + hk * p.k_head_stride;
  const Element* v_g = static_cast<const Element*>(p.v_ptr) + b * p.v_batch_stride +
                       (si.k_row0 + n0) * p.v_row_stride + hk * p.v_head_stride;
  const float* lse_g = p.lse_ptr + b * p.lse_batch_stride + h * p.lse_head_stride + si.q_row0;
  const float* dsum_g =
      p.dsoftmax_sum + b * p.lse_batch_stride + h * p.lse_head_stride + si.q_row0;
  const int64_t dq_row_stride = int64_t(p.nheads) * kD;
  float* dq_acc = args.dq_accum + (q_row_global(p, b, si) * p.nheads + h) * kD;
  const bool aligned = args.aligned_in;

  // Loads of query block m into stage st: Q, dO, and the LSE / D of its rows.
  const bool full_cols = aligned && p.headdim == kD && p.headdim_v == kD;
  auto load_q_block = [&](int m, int st) {
    const int m0 = m * kBM;
    if (full_cols && m0 + kBM <= sq) {
      load_tile_full<kBM, kD, kThreads>(sQ + st * kBM * kD, q_g + m0 * p.q_row_stride,
                                        p.q_row_stride, tid);
      load_tile_full<kBM, kD, kThreads>(sdO + st * kBM * kD, do_g + m0 * p.do_row_stride,
                                        p.do_row_stride, tid);
    } else {
      load_tile<kBM, kD, kThreads>(sQ + st * kBM * kD, q_g + m0 * p.q_row_stride,
                                   p.q_row_stride, sq - m0, p.headdim, aligned, tid);
      load_tile<kBM, kD, kThreads>(sdO + st * kBM * kD, do_g + m0 * p.do_row_stride,
                                   p.do_row_stride, sq - m0, p.headdim_v, aligned, tid);
    }
    if (tid < kBM) {
      const bool valid = m0 + tid < sq;
      cp_async_4(smem_u32(sLse + st * kBM + tid), valid ? lse_g + m0 + tid : lse_g, valid);
      cp_async_4(smem_u32(sDsum + st * kBM + tid), valid ? dsum_g + m0 + tid : dsum_g, valid);
    }
  };

  // dK / dV accumulators of this warp's rows of the key block.
  float acc_dk[kMT2][kNT2][4], acc_dv[kMT2][kNT2][4];
#pragma unroll
  for (int a = 0; a < kMT2; ++a)
#pragma unroll
    for (int c = 0; c < kNT2; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[a][c][e] = acc_dv[a][c][e] = 0.f;

  if (m_len > 0) {
    load_tile<kBN, kD, kThreads>(sK, k_g, p.k_row_stride, sk - n0, p.headdim, aligned, tid);
    load_tile<kBN, kD, kThreads>(sV, v_g, p.v_row_stride, sk - n0, p.headdim_v, aligned, tid);
    load_q_block(m_at(0), 0);
    cp_async_commit();
  }

  // Warp positions in the three layouts.
  const int wn1 = warp / Tile::kWarpsMSdP, wm1 = warp % Tile::kWarpsMSdP;
  const int wn2 = warp / Tile::kWarpsDdKV, wd2 = warp % Tile::kWarpsDdKV;
  const int wm3 = warp / Tile::kWarpsDdQ, wd3 = warp % Tile::kWarpsDdQ;
  // Per-lane ldmatrix patterns (see SwzLane): S^T/dP^T A (K, V) and B (Q, dO); dV/dK
  // A (sP, sdS: smem path) and B (dO, Q, transposed); dQ A (sdS, transposed), B (K, transposed).
  const SwzLane<kD, true> ix_sdp_a(wn1 * Tile::kTileNSdP + (lane & 15), (lane >> 4) * 8);
  const SwzLane<kD, true> ix_sdp_b(
      wm1 * Tile::kTileMSdP + (lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) * 8);
  const SwzLane<kBM, true> ix_dkv_a(wn2 * Tile::kTileNdKV + (lane & 15), (lane >> 4) * 8);
  const SwzLane<kD, kSwzFold<kD, Tile::kTileDdKV>> ix_dkv_b(
      (lane & 7) + ((lane >> 3) & 1) * 8, wd2 * Tile::kTileDdKV + (lane >> 4) * 8);
  const SwzLane<kBM, kSwzFold<kBM, Tile::kTileMdQ>> ix_dq_a(
      (lane & 7) + (lane >> 4) * 8, wm3 * Tile::kTileMdQ + ((lane >> 3) & 1) * 8);
  const SwzLane<kD, kSwzFold<kD, Tile::kTileDdQ>> ix_dq_b(
      (lane & 7) + ((lane >> 3) & 1) * 8, wd3 * Tile::kTileDdQ + (lane >> 4) * 8);
  // sm90 stmatrix of dS^T / P^T: the S^T warp tile's rows and 16-column steps.
  static_assert(kNT1 % 2 == 0, "stmatrix pairs of 8-column fragments");
  const SwzLane<kBM, kSwzFold<kBM, Tile::kTileMSdP>> ix_st(
      wn1 * Tile::kTileNSdP + (lane & 7) + ((lane >> 3) & 1) * 8,
      wm1 * Tile::kTileMSdP + (lane >> 4) * 8);
  const float slope_log2 = alibi_slope(p, b, h) * kLog2e;
  const float scale_log2 = p.softmax_scale_log2;
  const float cap = p.softcap;
  const bool softcap_on = Has_softcap || ((Has_dropout || Is_sparse) && cap > 0.f);
  const float scale_over_cap = softcap_on ? p.softmax_scale / cap : 0.f;
  DropoutRng rng{};
  // (Position offsets never reach the sm80 dropout kernels: backend_choice.h refuses them.)
  if constexpr (Has_dropout) rng = dropout_rng(p.rng_state, p.dropout_threshold, b, h, 0, 0);
  const float cap_log2 = cap * kLog2e;
  const int shift = mi.shift();
  // Deterministic mode: the counter of query block m is released (by thread 0, after a CTA
  // barrier: cumulative over the CTA's dQ adds) half an iteration later, at the next
  // iteration's mid barrier, when the adds have drained. Only where the next CTA in the
  // order reaches m at least a step later (rotated or descending order).
  const bool defer_release = args.rotate || descending;
  int* pending = nullptr;
  auto release_pending = [&]() {
    if (pending != nullptr && tid == 0) sem_release(pending);
    pending = nullptr;
  };
  const bool has_window = p.window_left >= 0 || p.window_right >= 0;

  for (int k = 0; k < m_len; ++k) {
    const int m = m_at(k);
    const int st = k & 1;
    const int m0 = m * kBM;
    cp_async_wait<0>();
    if (tid < kBM) {  // this thread's own copies: LSE -> log2 units, -inf -> +inf so P = 0
      const float l = sLse[st * kBM + tid];
      sLse[st * kBM + tid] = l == -INFINITY ? INFINITY : l * kLog2e;
    }
    __syncthreads();  // stage st visible; everyone is done with stage st ^ 1 and with sdS
    if (k + 1 < m_len) {
      load_q_block(m_at(k + 1), st ^ 1);
      cp_async_commit();
    }
    const Element* sQs = sQ + st * kBM * kD;
    const Element* sdOs = sdO + st * kBM * kD;
    const float* sLs = sLse + st * kBM;
    const float* sDs = sDsum + st * kBM;

    // dP^T = V dO^T and S^T = K Q^T for this warp's (key rows x query cols).
    float acc_s[kMT1][kNT1][4], acc_dp[kMT1][kNT1][4];
#pragma unroll
    for (int a = 0; a < kMT1; ++a)
#pragma unroll
      for (int c = 0; c < kNT1; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[a][c][e] = acc_dp[a][c][e] = 0.f;
    // Two passes (dP^T, then S^T) rather than one: fewer operand registers live at once.
    auto gemm_sdp = [&](float (&acc)[kMT1][kNT1][4], const Element* sA, const Element* sB) {
      const uint32_t a_u32 = smem_u32(sA), b_u32 = smem_u32(sB);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t fa[kMT1][4];
#pragma unroll
        for (int a = 0; a < kMT1; ++a)
          ldmatrix_x4(fa[a], a_u32 + 2 * ix_sdp_a.at(a * 16, kk * 16));
#pragma unroll
        for (int nj = 0; nj < kNT1 / 2; ++nj) {
          uint32_t fb[4];
          ldmatrix_x4(fb, b_u32 + 2 * ix_sdp_b.at(nj * 16, kk * 16));
          const uint32_t fb0[2] = {fb[0], fb[1]}, fb1[2] = {fb[2], fb[3]};
#pragma unroll
          for (int a = 0; a < kMT1; ++a) {
            mma_16816<Element>(acc[a][2 * nj], fa[a], fb0);
            mma_16816<Element>(acc[a][2 * nj + 1], fa[a], fb1);
          }
        }
      }
    };
    gemm_sdp(acc_dp, sV, sdOs);
    gemm_sdp(acc_s, sK, sQs);

    // P = exp2(s * log2e - lse * log2e) recomputed; dS = P (dP - D) [* (1 - tanh^2)].
    // Masking per element only on tiles that cross a boundary (or with ALiBi). The test is
    // hoisted out of the element loop: a branch per element serialises the ex2 latencies.
    const bool full_tile = m0 + kBM <= sq && n0 + kBN <= sk &&
                           (!has_window || (mi.key_begin(m0 + kBM - 1) <= n0 &&
                                            mi.key_end(m0) >= n0 + kBN));
    auto pointwise = [&](auto kMasked, auto kCap) {
      constexpr bool kM = decltype(kMasked)::value, kC = decltype(kCap)::value;
      // This lane's query rows ml0, ml0 + 1 of column tile c: their LSE, D and (masked) the
      // visible keys [kb, ke) (empty past sq): one range test per element, no branches.
      struct Rows {
        float2 lse2, dsum2;
        int kb[2], ke[2];
      };
      auto rows_of = [&](int c) {
        Rows r;
        const int ml0 = wm1 * Tile::kTileMSdP + c * 8 + (lane % 4) * 2;
        r.lse2 = *reinterpret_cast<const float2*>(sLs + ml0);
        r.dsum2 = *reinterpret_cast<const float2*>(sDs + ml0);
        r.kb[0] = r.kb[1] = r.ke[0] = r.ke[1] = 0;
        if constexpr (kM) {
#pragma unroll
          for (int par = 0; par < 2; ++par) {
            const int i = m0 + ml0 + par, ci = i + shift;  // key_begin / key_end, as selects
            const int lo = mi.window_left >= 0 ? ci - mi.window_left : 0;
            const int hi = mi.window_right >= 0 ? ci + mi.window_right + 1 : sk;
            r.kb[par] = max(lo, 0);
            r.ke[par] = i < sq ? min(hi, sk) : 0;
          }
        }
        return r;
      };
      // Element e of tile (a, c); z = Z * dropout_scale (1 without dropout).
      auto element = [&](int a, int c, int e, const Rows& r, float z) {
        float x, dtanh = 1.f;
        if constexpr (kC) {
          const float t = fast_tanh(acc_s[a][c][e] * scale_over_cap);
          x = t * cap_log2;
          dtanh = 1.f - t * t;
        } else {
          x = acc_s[a][c][e] * scale_log2;
        }
        if constexpr (kM) {
          const int ml0 = wm1 * Tile::kTileMSdP + c * 8 + (lane % 4) * 2;
          const int nl = wn1 * Tile::kTileNSdP + a * 16 + lane / 4 + (e >= 2 ? 8 : 0);
          const int i = m0 + ml0 + (e & 1), j = n0 + nl;
          const int dist = i + shift - j;
          x -= slope_log2 * static_cast<float>(dist < 0 ? -dist : dist);
          x = (j >= r.kb[e & 1] && j < r.ke[e & 1]) ? x : -INFINITY;
        }
        const float pv = fast_exp2(x - ((e & 1) ? r.lse2.y : r.lse2.x));
        const float d = (e & 1) ? r.dsum2.y : r.dsum2.x;
        if constexpr (Has_dropout) {
          // dV takes Z P scale; dS = P (Z dP scale - D).
          acc_s[a][c][e] = pv * z;
          acc_dp[a][c][e] = pv * (acc_dp[a][c][e] * z - d) * dtanh;
        } else {
          acc_s[a][c][e] = pv;
          acc_dp[a][c][e] = pv * (acc_dp[a][c][e] - d) * dtanh;
        }
      };
      if constexpr (!Has_dropout) {
#pragma unroll
        for (int c = 0; c < kNT1; ++c) {
          const Rows r = rows_of(c);
#pragma unroll
          for (int a = 0; a < kMT1; ++a)
#pragma unroll
            for (int e = 0; e < 4; ++e) element(a, c, e, r, 1.f);
        }
      } else {
        // The 16 x 16 blocks (a, cp) of this warp tile (key tile a, query tiles 2 cp, 2 cp +
        // 1), two per Philox call (dropout_lanes.cuh): paired along a when kMT1 is even,
        // else along cp when that count is even, else each block alone (both lanes draw it).
        constexpr int kCp = kNT1 / 2;
        constexpr bool kAlongA = kMT1 % 2 == 0, kAlongCp = !kAlongA && kCp % 2 == 0;
        constexpr int kPairs = kAlongA ? kMT1 / 2 * kCp : kAlongCp ? kMT1 * kCp / 2 : kMT1 * kCp;
        const float keep_z = p.dropout_scale;
#pragma unroll
        for (int pi = 0; pi < kPairs; ++pi) {
          int a0, cp0, a1, cp1;
          if constexpr (kAlongA) {
            a0 = 2 * (pi % (kMT1 / 2)), cp0 = pi / (kMT1 / 2), a1 = a0 + 1, cp1 = cp0;
          } else if constexpr (kAlongCp) {
            a0 = pi % kMT1, cp0 = 2 * (pi / kMT1), a1 = a0, cp1 = cp0 + 1;
          } else {
            a0 = a1 = pi % kMT1, cp0 = cp1 = pi / kMT1;
          }
          auto qblk = [&](int cp) { return (m0 + wm1 * Tile::kTileMSdP + cp * 16) >> 4; };
          auto kblk = [&](int a) { return (n0 + wn1 * Tile::kTileNSdP + a * 16) >> 4; };
          uint32_t w[2][2];
          dropout_words_st<false>(rng, qblk(cp0), kblk(a0), qblk(cp1), kblk(a1), lane, w[0],
                                  w[1]);
          constexpr int kBlocks = (kAlongA || kAlongCp) ? 2 : 1;
#pragma unroll
          for (int blk = 0; blk < kBlocks; ++blk) {
            const int a = blk ? a1 : a0, cp = blk ? cp1 : cp0;
            const uint32_t kept[2] = {dropout_kept4(rng, w[blk][0]),
                                      dropout_kept4(rng, w[blk][1])};
#pragma unroll
            for (int ch = 0; ch < 2; ++ch) {
              const int c = 2 * cp + ch;
              const Rows r = rows_of(c);
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const bool keep = (kept[e & 1] >> (8 * (2 * ch + (e >> 1)))) & 1u;
                element(a, c, e, r, keep ? keep_z : 0.f);
              }
            }
          }
        }
      }
    };
    const bool masked = !full_tile || slope_log2 != 0.f;
    if constexpr (Has_dropout || Is_sparse) {  // softcap switched at run time
      if (masked) {
        if (softcap_on) pointwise(std::true_type{}, std::true_type{});
        else pointwise(std::true_type{}, std::false_type{});
      } else {
        if (softcap_on) pointwise(std::false_type{}, std::true_type{});
        else pointwise(std::false_type{}, std::false_type{});
      }
    } else {
      const std::integral_constant<bool, Has_softcap> cap_flag;
      if (masked)
        pointwise(std::true_type{}, cap_flag);
      else
        pointwise(std::false_type{}, cap_flag);
    }

    // Block-sparse units: P and dS zeroed on the dropped blocks' units of a partial tile.
    if (Is_sparse && unit_mode)
      zero_dropped_units<kBN / 16, kBM / 16>(unit_masks[m], wn1 * Tile::kTileNSdP,
                                               wm1 * Tile::kTileMSdP, acc_s, acc_dp);

    // dS^T (and P^T on the smem path) to smem: [key row][query col], swizzled.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // sm90: stmatrix.x4 stores four 8x8 fragments (16 rows x 16 cols) per instruction
    // where 4-byte stores took four; lane l gives row l % 8 of matrix l / 8.
#pragma unroll
    for (int a = 0; a < kMT1; ++a)
#pragma unroll
      for (int c2 = 0; c2 < kNT1 / 2; ++c2) {
        const uint32_t off = 2 * ix_st.at(a * 16, c2 * 16);
        auto store = [&](uint32_t base, const float (&acc)[kMT1][kNT1][4]) {
          const uint32_t r[4] = {pack2<Element>(acc[a][2 * c2][0], acc[a][2 * c2][1]),
                                 pack2<Element>(acc[a][2 * c2][2], acc[a][2 * c2][3]),
                                 pack2<Element>(acc[a][2 * c2 + 1][0], acc[a][2 * c2 + 1][1]),
                                 pack2<Element>(acc[a][2 * c2 + 1][2], acc[a][2 * c2 + 1][3])};
          stmatrix_x4(base + off, r);
        };
        store(smem_u32(sdS), acc_dp);
        if constexpr (!Tile::kPInRegs) store(smem_u32(sP), acc_s);
      }
#else
#pragma unroll
    for (int a = 0; a < kMT1; ++a)
#pragma unroll
      for (int c = 0; c < kNT1; ++c)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int nl = wn1 * Tile::kTileNSdP + a * 16 + lane / 4 + half * 8;
          const int ml = wm1 * Tile::kTileMSdP + c * 8 + (lane % 4) * 2;
          *reinterpret_cast<uint32_t*>(sdS + swz<kBM>(nl, ml)) =
              pack2<Element>(acc_dp[a][c][2 * half], acc_dp[a][c][2 * half + 1]);
          if constexpr (!Tile::kPInRegs)
            *reinterpret_cast<uint32_t*>(sP + swz<kBM>(nl, ml)) =
                pack2<Element>(acc_s[a][c][2 * half], acc_s[a][c][2 * half + 1]);
        }
#endif
    if constexpr (!Tile::kPInRegs) {
      __syncthreads();  // P^T / dS^T rows of other warps
      release_pending();
    }

    // dV += P^T dO and dK += dS^T Q (k = the query rows of this block), one GEMM each: A
    // from registers (kPInRegs: acc_s / acc_dp) or from smem (sP / sdS), B from dO / Q.
    // kReds: the dQ REDs spread over its (kBM / 16) * (kNT2 / 2) steps (red_step below).
    float acc_dq[kMT3][kNT3][4];
    float* dq_base = nullptr;
    int dq_rows_left = 0;
    auto red_step = [&](int step) {
#pragma unroll
      for (int mi = 0; mi < kMT3; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int ni = 0; ni < kNT3; ++ni) {
            const int idx = (mi * 2 + half) * kNT3 + ni;
            if (idx < step * kDqReds / kRedSteps || idx >= (step + 1) * kDqReds / kRedSteps)
              continue;
            const int dr = (2 * mi + half) * 8;
            if (dr < dq_rows_left)
              red_add_f32x2(dq_base + dr * dq_row_stride + ni * 8, acc_dq[mi][ni][half * 2],
                            acc_dq[mi][ni][half * 2 + 1]);
          }
    };
    auto gemm_dkv = [&](float (&acc)[kMT2][kNT2][4], const float (&a_reg)[kMT1][kNT1][4],
                        const Element* sA, const Element* sB, bool with_reds, int step0) {
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        uint32_t fa[kMT2][4];
#pragma unroll
        for (int a = 0; a < kMT2; ++a) {
          if constexpr (Tile::kPInRegs) {
            fa[a][0] = pack2<Element>(a_reg[a][2 * kk][0], a_reg[a][2 * kk][1]);
            fa[a][1] = pack2<Element>(a_reg[a][2 * kk][2], a_reg[a][2 * kk][3]);
            fa[a][2] = pack2<Element>(a_reg[a][2 * kk + 1][0], a_reg[a][2 * kk + 1][1]);
            fa[a][3] = pack2<Element>(a_reg[a][2 * kk + 1][2], a_reg[a][2 * kk + 1][3]);
          } else {
            ldmatrix_x4(fa[a], smem_u32(sA) + 2 * ix_dkv_a.at(a * 16, kk * 16));
          }
        }
#pragma unroll
        for (int nd = 0; nd < kNT2 / 2; ++nd) {
          uint32_t fb[4];
          ldmatrix_x4_trans(fb, smem_u32(sB) + 2 * ix_dkv_b.at(kk * 16, nd * 16));
          const uint32_t fb0[2] = {fb[0], fb[1]}, fb1[2] = {fb[2], fb[3]};
#pragma unroll
          for (int a = 0; a < kMT2; ++a) {
            mma_16816<Element>(acc[a][2 * nd], fa[a], fb0);
            mma_16816<Element>(acc[a][2 * nd + 1], fa[a], fb1);
          }
          if (with_reds) red_step(step0 + kk * (kNT2 / 2) + nd);  // a constant once inlined
        }
      }
    };
    if constexpr (!kDqFirst) gemm_dkv(acc_dv, acc_s, sP, sdOs, false, 0);
    if constexpr (!kSpread) gemm_dkv(acc_dk, acc_dp, sdS, sQs, false, 0);
    if constexpr (Tile::kPInRegs) {
      __syncthreads();  // dS^T rows of other warps
      release_pending();
    }

    // dQ (unscaled) = dS K: A from dS^T (trans), B from K (trans), k = the key rows.
#pragma unroll
    for (int a = 0; a < kMT3; ++a)
#pragma unroll
      for (int c = 0; c < kNT3; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[a][c][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t ads[kMT3][4];
#pragma unroll
      for (int a = 0; a < kMT3; ++a) {
        ldmatrix_x4_trans(ads[a], smem_u32(sdS) + 2 * ix_dq_a.at(kk * 16, a * 16));
      }
#pragma unroll
      for (int nd = 0; nd < kNT3 / 2; ++nd) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, smem_u32(sK) + 2 * ix_dq_b.at(kk * 16, nd * 16));
        const uint32_t bk0[2] = {bk[0], bk[1]}, bk1[2] = {bk[2], bk[3]};
#pragma unroll
        for (int a = 0; a < kMT3; ++a) {
          mma_16816<Element>(acc_dq[a][2 * nd], ads[a], bk0);
          mma_16816<Element>(acc_dq[a][2 * nd + 1], ads[a], bk1);
        }
      }
    }
    // Deterministic: key blocks add into query block m in a fixed order, serialised by a
    // per-(b, h, m) counter.
    int* sem = nullptr;
    if (args.dq_sem != nullptr) {
      sem = args.dq_sem + (int64_t(b) * p.nheads + h) * args.m_blocks + m;
      if (tid == 0)
        sem_wait(sem, args.rotate ? chunked_rotated_rank(n_block, m, m_blocks, chunk)
                                  : contributor_rank<kBM, kBN>(mi, n_block, m, m_blocks,
                                                               args.n_blocks, descending));
      __syncthreads();
    }
    if constexpr (!kSpread) {
      red_acc<kMT3, kNT3>(acc_dq, dq_acc + int64_t(m0) * dq_row_stride, dq_row_stride,
                          wm3 * Tile::kTileMdQ, wd3 * Tile::kTileDdQ, sq - m0, 1.f, lane);
    } else {
      // dK's GEMM (and dV's, kDqFirst) with the dQ REDs spread over its steps: a burst of REDs
      // stalls the warps on the LSU queue (H200 Nsight Compute: LG throttle, barrier waits).
      const int dq_row = wm3 * Tile::kTileMdQ + lane / 4;
      dq_rows_left = sq - m0 - dq_row;
      dq_base = dq_acc + (int64_t(m0) + dq_row) * dq_row_stride + wd3 * Tile::kTileDdQ +
                (lane % 4) * 2;
      if constexpr (kDqFirst) gemm_dkv(acc_dv, acc_s, sP, sdOs, true, 0);
      gemm_dkv(acc_dk, acc_dp, sdS, sQs, true, kDqFirst ? kDkvSteps : 0);
    }
    if (sem != nullptr) {
      if (defer_release) {
        pending = sem;
      } else {
        __syncthreads();
        if (tid == 0) sem_release(sem);
      }
    }
  }
  if (pending != nullptr) {
    __syncthreads();
    if (tid == 0) sem_release(pending);
  }

  // Epilogue: dK = scale * dS^T Q; dV. Direct stores, or (GQA) fp32 adds into the
  // workspace, ordered over the heads of the group in deterministic mode.
  const int row0 = wn2 * Tile::kTileNdKV, col0 = wd2 * Tile::kTileDdKV;
  if (args.group == 1) {
    Element* dk_g = static_cast<Element*>(p.dk_ptr) + b * p.dk_batch_stride +
                    (si.k_row0 + n0) * p.dk_row_stride + hk * p.dk_head_stride;
    Element* dv_g = static_cast<Element*>(p.dv_ptr) + b * p.dv_batch_stride +
                    (si.k_row0 + n0) * p.dv_row_stride + hk * p.dv_head_stride;
    store_acc(acc_dk, dk_g, p.dk_row_stride, row0, col0, sk - n0, p.headdim, p.softmax_scale,
              args.pair_out, lane);
    store_acc(acc_dv, dv_g, p.dv_row_stride, row0, col0, sk - n0, p.headdim_v, 1.f,
              args.pair_out, lane);
    // Block-sparse varlen: a sequence's keys past the mask's (max_seqlen_k below its length)
    // are kept by no query block: dK = dV = 0, from the last CTA (GQA: the zeroed accumulators).
    if (Is_sparse && p.is_varlen && n_block == int(gridDim.x) - 1) {
      const int real_k = seq_info(p, b).seqlen_k, nw = Tile::kNWarps;
      zero_rows_16bit(dk_g, p.dk_row_stride, sk - n0, real_k - n0, p.headdim, warp, nw, lane);
      zero_rows_16bit(dv_g, p.dv_row_stride, sk - n0, real_k - n0, p.headdim_v, warp, nw, lane);
    }
    return;
  }
  if (m_len == 0) return;  // nothing to add
  int* sem = nullptr;
  if (args.dkv_sem != nullptr) {
    sem = args.dkv_sem + (int64_t(b) * p.nheads_k + hk) * args.n_blocks + n_block;
    if (tid == 0) sem_wait(sem, h % args.group);
    __syncthreads();
  }
  const int64_t kv_row_stride = int64_t(p.nheads_k) * kD;
  const int64_t kv_off = ((k_row_global(p, b, si) + n0) * p.nheads_k + hk) * kD;
  red_acc<kMT2, kNT2>(acc_dk, args.dk_accum + kv_off, kv_row_stride, row0, col0, sk - n0,
                          p.softmax_scale, lane);
  red_acc<kMT2, kNT2>(acc_dv, args.dv_accum + kv_off, kv_row_stride, row0, col0, sk - n0,
                          1.f, lane);
  if (sem != nullptr) {
    __syncthreads();
    if (tid == 0) sem_release(sem);
  }
}

}  // namespace bwd_detail
}  // namespace flashattn::sm80
