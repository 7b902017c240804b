// The sm80 forward kernel (FlashAttention-2 algorithm): one CTA per (query block, head, batch).
// Q in shared memory (re-read per key block with ldmatrix), K/V tiles through shared memory with
// cp.async (kStages buffers each), mma.sync m16n8k16 with fp32 accumulation, the online softmax
// in registers (exp2 with the scale folded into log2 space), normalisation at the end.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

#include "../common/block_sparse_tiles.cuh"
#include "../common/dropout_lanes.cuh"
#include "../common/mask.h"
#include "../common/params.h"
#include "../common/row_finish.h"
#include "../common/score_mod.h"
#include "../common/seqlen.h"
#include "primitives_sm80.cuh"
#include "tile_fwd_sm80.h"

namespace flashattn::sm80 {

// A (kRows x kHeadDim) tile of 16-bit elements in shared memory. Columns are split into panels
// of 64 (or 32) elements; row r of a panel holds its 16-byte chunks XOR-swizzled by the row so
// that the 8 rows read by one ldmatrix (or written by 8 cp.async) hit 8 distinct bank groups.
template <int kRows, int kHeadDim>
struct SmemTile {
  static constexpr int kPanelChunks = (kHeadDim % 64 == 0) ? 8 : 4;
  static constexpr int kRowBytes = kPanelChunks * 16;
  static constexpr int kPanelBytes = kRows * kRowBytes;
  static constexpr int kBytes = kRows * kHeadDim * 2;
  static_assert(kHeadDim % 32 == 0, "head-dim buckets are multiples of 32");

  __device__ static __forceinline__ int swizzle(int row) {
    // 128-byte rows: chunk ^ (row % 8); 64-byte rows: two rows share a 128-byte line.
    if constexpr (kPanelChunks == 8) return row & 7;
    else return (row >> 1) & 3;
  }
  // Byte offset of 16-byte chunk `chunk` (8 columns) of row `row`.
  __device__ static __forceinline__ uint32_t offset(int row, int chunk) {
    return (chunk / kPanelChunks) * kPanelBytes + row * kRowBytes +
           (((chunk % kPanelChunks) ^ swizzle(row)) << 4);
  }
};

// Thread -> (row, chunk) map of a global <-> shared tile copy: kThreadsPerRow threads cover
// consecutive 16-byte chunks of a row (coalesced); rows advance by kRowsPerStep (a multiple of
// 8, so a thread's swizzle key is the same for all its rows).
template <int kRows, int kHeadDim, int kNThreads>
struct TileCopy {
  static constexpr int kChunksPerRow = kHeadDim / 8;
  // The largest power-of-2 divisor of the chunks per row, capped so that kRowsPerStep >= 8.
  static constexpr int kLowBit = kChunksPerRow & (-kChunksPerRow);
  static constexpr int kThreadsPerRow = kLowBit < kNThreads / 8 ? kLowBit : kNThreads / 8;
  static constexpr int kRowsPerStep = kNThreads / kThreadsPerRow;
  static constexpr int kRowIters = kRows / kRowsPerStep;
  static constexpr int kColIters = kChunksPerRow / kThreadsPerRow;
  static_assert(kNThreads % kThreadsPerRow == 0 && kRowsPerStep % 8 == 0,
                "a thread's rows must share one swizzle key");
  static_assert(kRows % kRowsPerStep == 0, "the tile rows must split evenly over the threads");
};

// The tile parameters default to the policy in tile_fwd_sm80.h; they are template parameters so
// that a benchmark can instantiate alternatives side by side.
template <int kHeadDim_, typename Element_, int kBlockM_ = fwd_tile(kHeadDim_).block_m,
          int kBlockN_ = fwd_tile(kHeadDim_).block_n, int kNWarps_ = fwd_tile(kHeadDim_).warps,
          int kStages_ = fwd_tile(kHeadDim_).stages,
          int kMinBlocks_ = fwd_tile(kHeadDim_).min_blocks>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kMFrags = kBlockM / (16 * kNWarps);  // m16 row tiles per warp
  static constexpr int kNFragsS = kBlockN / 8;              // n8 column tiles of S
  static constexpr int kNFragsO = kHeadDim / 8;             // n8 column tiles of O
  static constexpr int kKStepsQK = kHeadDim / 16;
  static constexpr int kKStepsPV = kBlockN / 16;
  using TileQ = SmemTile<kBlockM, kHeadDim>;
  using TileKV = SmemTile<kBlockN, kHeadDim>;
  using CopyQ = TileCopy<kBlockM, kHeadDim, kNThreads>;
  using CopyKV = TileCopy<kBlockN, kHeadDim, kNThreads>;
  static constexpr int kSmemBytes = TileQ::kBytes + 2 * kStages * TileKV::kBytes;
  static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole m16 tiles");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "n-fragments are loaded in pairs");
  static_assert(kStages >= 1 && kStages <= 2, "the wait counts below assume 1 or 2 stages");
};

// The 16-bit elements of columns [col, col + 8) at `src` into the 16 bytes of shared memory at
// `dst`, those at or past column `cols` (all of them when !ok) zero: the element-wise path of
// a chunk that straddles the head dim or sits on a base not 16-byte aligned.
__device__ __forceinline__ void copy_chunk_elementwise(uint32_t dst, const void* src, bool ok,
                                                       int col, int cols) {
  uint16_t e[8];
  const auto* s16 = reinterpret_cast<const uint16_t*>(src);
#pragma unroll
  for (int k = 0; k < 8; ++k) e[k] = (ok && col + k < cols) ? s16[k] : 0;
  st_shared_v4(dst, make_uint4(e[0] | (uint32_t(e[1]) << 16), e[2] | (uint32_t(e[3]) << 16),
                               e[4] | (uint32_t(e[5]) << 16), e[6] | (uint32_t(e[7]) << 16)));
}

// Loads rows [0, kRows) of a tile whose row 0 is at `src` into shared memory at `dst`. Rows at or
// past `rows_valid` (checked only when Check_rows) and columns at or past `cols_valid` are
// zero-filled (cp.async src_size 0 at a clamped address). Not Is_even_K: chunks straddling
// cols_valid, or any chunk when the tensor is not 16-byte aligned (vec_ok false), go through
// 2-byte loads.
template <typename Copy, typename Tile, bool Is_even_K, bool Check_rows, typename Element>
__device__ __forceinline__ void load_tile(uint32_t dst, const Element* src, int64_t row_stride,
                                          int rows_valid, int cols_valid, bool vec_ok,
                                          const void* safe_src) {
  const int row0 = threadIdx.x / Copy::kThreadsPerRow;
  const int chunk0 = threadIdx.x % Copy::kThreadsPerRow;
  const Element* src_thread = src + row0 * row_stride + chunk0 * 8;
  const int64_t step = Copy::kRowsPerStep * row_stride;
#pragma unroll
  for (int c = 0; c < Copy::kColIters; ++c) {
    const int chunk = chunk0 + c * Copy::kThreadsPerRow;
    const int col = chunk * 8;
#pragma unroll
    for (int i = 0; i < Copy::kRowIters; ++i) {
      const int row = row0 + i * Copy::kRowsPerStep;
      const uint32_t d = dst + Tile::offset(row, chunk);
      const bool row_ok = !Check_rows || row < rows_valid;
      const Element* s = src_thread + i * step + c * Copy::kThreadsPerRow * 8;
      if (Is_even_K && !Check_rows) {
        cp_async_16(d, s);
      } else if (Is_even_K || (vec_ok && col + 8 <= cols_valid)) {
        cp_async_16(d, row_ok ? static_cast<const void*>(s) : safe_src, row_ok);
      } else {
        copy_chunk_elementwise(d, s, row_ok, col, cols_valid);
      }
    }
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Is_even_K: headdim == headdim_v == kHeadDim and every tensor 16-byte aligned (no column masks).
// Has_score_mod: softcap and/or ALiBi (or a non-positive scale): scores are transformed to
// natural-log units before the softmax; otherwise the raw q.k feeds exp2 with the folded scale.
// Has_dropout: dropout (params.h) on P before P V; such a kernel decides the score transform
// at run time (one instantiation for both). The attention sink is a run-time option of every
// variant (the epilogue only).
// Is_sparse: block-sparse (params.h: kv_num_blocks / kv_indices); the CTA's query tile lies in
// one mask query block (block_m a multiple of kBlockM) and visits the kernel key blocks of its
// kept mask key blocks (block_n a multiple of kBlockN) that intersect the visible keys, listed
// in shared memory past the tiles (list_cap entries) by warp 0. Such a kernel takes
// Has_dropout = true with dropout a run-time switch (one instantiation for both).
// Block sizes that do not nest (block_m not a multiple of kBlockM or block_n of kBlockN; both
// are multiples of 16) take the unit path, a run-time switch: every 16 x 16 unit of a kernel
// tile lies in one mask block, so warp 0 ORs a 64-bit keep mask per kernel key tile (bit
// 8 * row unit + column unit) from the kept mask blocks of the tile's row units, lists the
// tiles whose mask is not empty, and S takes -inf on the units of a partial tile's dropped
// blocks before the softmax (list_cap ints, then list_cap uint64 masks, 8-byte aligned).
template <typename Traits, bool Is_even_K, bool Has_score_mod, bool Has_dropout = false,
          bool Is_sparse = false>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocks)
    fwd_kernel_sm80(const __grid_constant__ FwdParams p, const bool vec_ok,
                    const bool heavy_first, const int list_cap = 0) {
  using Element = typename Traits::Element;
  using TileQ = typename Traits::TileQ;
  using TileKV = typename Traits::TileKV;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kNWarps = Traits::kNWarps;
  constexpr int kStages = Traits::kStages, kMFrags = Traits::kMFrags;
  constexpr int kNFragsS = Traits::kNFragsS, kNFragsO = Traits::kNFragsO;
  constexpr float kLn2 = 0.6931471805599453f;

  extern __shared__ __align__(128) unsigned char smem[];
  // Longest causal blocks (highest m) first: less tail. heavy_first: over the whole grid (m
  // the slowest index; the host sets it below 2^31 blocks), else within each (head, batch),
  // which keeps one head's K / V hot in L2.
  int m_block, h, b;
  if (heavy_first) {
    const GridCoord c = x_slowest_coord();
    m_block = gridDim.x - 1 - c.x_rank;
    h = c.y;
    b = c.z;
  } else {
    m_block = gridDim.x - 1 - blockIdx.x;
    h = blockIdx.y;
    b = blockIdx.z;
  }
  const SeqInfo seq = seq_info(p, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.seqlen_q) return;
  MaskInfo mask = mask_info(p, seq);
  mask.pos_shift = pos_shift_of(p, b);
  const int shift = mask.shift();
  const int rows_q = min(kBlockM, seq.seqlen_q - m0);
  const int m_last = m0 + rows_q - 1;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hk = h / (p.nheads / p.nheads_k);
  const Element* q = static_cast<const Element*>(p.q_ptr) + b * p.q_batch_stride +
                     (seq.q_row0 + m0) * p.q_row_stride + h * p.q_head_stride;
  const Element* k = static_cast<const Element*>(p.k_ptr) + b * p.k_batch_stride +
                     seq.k_row0 * p.k_row_stride + hk * p.k_head_stride;
  const Element* v = static_cast<const Element*>(p.v_ptr) + b * p.v_batch_stride +
                     seq.k_row0 * p.v_row_stride + hk * p.v_head_stride;

  // Key blocks [n_begin, n_end) hold every key visible to some row of this block.
  const int key_lo = mask.key_begin(m0), key_hi = mask.key_end(m_last);
  const int n_begin = key_lo / kBlockN;
  const int n_dense = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN - n_begin : 0;
  const int n_last = n_begin + n_dense - 1;  // dense: iteration `it` works on block n_last - it
  int* sparse_list = reinterpret_cast<int*>(smem + Traits::kSmemBytes);
  int n_iters = n_dense;
  // Block-sparse: warp 0 lists the visited key tiles (block_sparse_tiles.cuh); block sizes
  // that do not nest take the unit path, a 64-bit unit mask per key tile past the list.
  const bool unit_mode =
      Is_sparse && (p.block_m % kBlockM != 0 || p.block_n % kBlockN != 0);
  unsigned long long* unit_masks = reinterpret_cast<unsigned long long*>(
      smem + Traits::kSmemBytes + ((4 * list_cap + 7) & ~7));
  if constexpr (Is_sparse) {
    __shared__ int sparse_count;
    if (warp == 0) {
      const SparseAxes axes{p.kv_num_blocks, p.kv_indices,
                            b * p.bs_batch_stride + h * p.bs_head_stride,
                            p.n_qblocks, p.n_kblocks, p.block_m, p.block_n};
      const int cnt = build_sparse_tiles<kBlockM, kBlockN>(
          axes, m0, seq.seqlen_q, n_begin, n_begin + n_dense, sparse_list,
          unit_mode ? unit_masks : nullptr, list_cap, lane);
      if (lane == 0) sparse_count = min(cnt, list_cap);
    }
    __syncthreads();
    n_iters = sparse_count;
  }
  // The key block of iteration `it`.
  auto block_of = [&](int it) { return Is_sparse ? sparse_list[it] : n_last - it; };

  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + TileQ::kBytes;
  const uint32_t sV = sK + kStages * TileKV::kBytes;

  float acc_o[kMFrags][kNFragsO][4];
#pragma unroll
  for (int mi = 0; mi < kMFrags; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNFragsO; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mi][ni][e] = 0.f;
  float row_max[2 * kMFrags], row_sum[2 * kMFrags];
#pragma unroll
  for (int r = 0; r < 2 * kMFrags; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.f;
  }
  // The dropout variant takes the score transform as a run-time switch (uniform).
  const bool score_mod_on =
      Has_score_mod || (Has_dropout && (p.softcap > 0.f || p.alibi_slopes != nullptr ||
                                        !(p.softmax_scale > 0.f)));
  const float scale_log2 = score_mod_on ? 1.4426950408889634f : p.softmax_scale_log2;
  DropoutRng rng{};
  const bool drop_on = Has_dropout && (!Is_sparse || p.dropout_threshold > 0);
  // (Position offsets never reach the sm80 dropout kernels: backend_choice.h refuses them.)
  if (drop_on) rng = dropout_rng(p.rng_state, p.dropout_threshold, b, h, 0, 0);

  // This thread's rows in the block: row(mi, half) = mi*16*kNWarps + warp*16 + g + 8*half.
  const int g = lane >> 2, t = lane & 3;
  auto row_of = [&](int mi, int half) { return mi * 16 * kNWarps + warp * 16 + g + 8 * half; };

  if (n_iters > 0) {
    // Only key block n_last (iteration 0) can cross the end of the keys: row checks there only
    // (block-sparse: any block of the list may be the last, checked where it is).
    using CopyKV = typename Traits::CopyKV;
    // K or V of iteration it into its stage (base: the tensor at the sequence's first key).
    auto load_kv = [&](uint32_t s_base, const Element* base, int64_t row_stride, int cols,
                       const void* safe, int it, auto check_rows) {
      const int n0 = block_of(it) * kBlockN;
      const uint32_t dst = s_base + (it % kStages) * TileKV::kBytes;
      if (Is_sparse && !decltype(check_rows)::value && n0 + kBlockN > seq.seqlen_k) {
        load_tile<CopyKV, TileKV, Is_even_K, true>(dst, base + n0 * row_stride, row_stride,
                                                   seq.seqlen_k - n0, cols, vec_ok, safe);
        return;
      }
      load_tile<CopyKV, TileKV, Is_even_K, decltype(check_rows)::value>(
          dst, base + n0 * row_stride, row_stride, seq.seqlen_k - n0, cols, vec_ok, safe);
    };
    auto load_k = [&](int it, auto check_rows) {
      load_kv(sK, k, p.k_row_stride, p.headdim, p.k_ptr, it, check_rows);
    };
    auto load_v = [&](int it, auto check_rows) {
      load_kv(sV, v, p.v_row_stride, p.headdim_v, p.v_ptr, it, check_rows);
    };
    const std::true_type checked;
    const std::false_type unchecked;
    // Prologue: group {Q, K0}, then {V0}, {K1} when two stages (empty groups keep the counts).
    load_tile<typename Traits::CopyQ, TileQ, Is_even_K, true>(sQ, q, p.q_row_stride, rows_q,
                                                              p.headdim, vec_ok, p.q_ptr);
    load_k(0, checked);
    cp_async_commit();
    if constexpr (kStages == 2) {
      load_v(0, checked);
      cp_async_commit();
      if (1 < n_iters) load_k(1, unchecked);
      cp_async_commit();
    }

    // Per-lane ldmatrix coordinates (see SmemTile): A (Q) and V^T take rows l%8 + 8*((l>>3)&1)
    // and chunk +(l>>4); B (K) takes rows l%8 + 8*(l>>4) and chunk +((l>>3)&1).
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_hi = lane >> 4;
    const int b_row = (lane & 7) + (lane >> 4) * 8, b_hi = (lane >> 3) & 1;
    const uint32_t q_lane = sQ + (warp * 16 + a_row) * TileQ::kRowBytes;
    const int q_xor = a_hi ^ TileQ::swizzle(a_row);
    const uint32_t k_lane = b_row * TileKV::kRowBytes;
    const int k_xor = b_hi ^ TileKV::swizzle(b_row);
    const uint32_t v_lane = a_row * TileKV::kRowBytes;
    const int v_xor = a_hi ^ TileKV::swizzle(a_row);
    // Offset of the even chunk c (plus this lane's chunk bit) of a lane row, swizzled.
    auto q_off = [&](int mi, int c) {
      return q_lane + (c / TileQ::kPanelChunks) * TileQ::kPanelBytes +
             mi * 16 * kNWarps * TileQ::kRowBytes +
             (((c % TileQ::kPanelChunks) ^ q_xor) << 4);
    };
    auto kv_off = [&](uint32_t lane_base, int x, int r, int c) {
      return lane_base + (c / TileKV::kPanelChunks) * TileKV::kPanelBytes +
             r * TileKV::kRowBytes + (((c % TileKV::kPanelChunks) ^ x) << 4);
    };

    for (int it = 0; it < n_iters; ++it) {
      const int n0 = block_of(it) * kBlockN;
      const uint32_t sKs = sK + (it % kStages) * TileKV::kBytes;
      const uint32_t sVs = sV + (it % kStages) * TileKV::kBytes;
      // K(it) has landed once at most 2*(kStages-1) newer groups are pending; the barrier also
      // tells every warp is done with V(it-1), whose buffer V(it+kStages-1) now refills.
      cp_async_wait<2 * (kStages - 1)>();
      __syncthreads();
      if constexpr (kStages == 1) {
        if (it == 0) load_v(0, checked);
        else load_v(it, unchecked);
      } else if (it + 1 < n_iters) {
        load_v(it + 1, unchecked);
      }
      cp_async_commit();

      // S = Q K^T
      float acc_s[kMFrags][kNFragsS][4];
#pragma unroll
      for (int mi = 0; mi < kMFrags; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNFragsS; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mi][ni][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < Traits::kKStepsQK; ++ks) {
        uint32_t a[kMFrags][4];
#pragma unroll
        for (int mi = 0; mi < kMFrags; ++mi) ldmatrix_x4(a[mi], q_off(mi, 2 * ks));
#pragma unroll
        for (int np = 0; np < kNFragsS / 2; ++np) {
          uint32_t bb[4];
          ldmatrix_x4(bb, sKs + kv_off(k_lane, k_xor, np * 16, 2 * ks));
          const uint32_t b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
#pragma unroll
          for (int mi = 0; mi < kMFrags; ++mi) {
            mma_16816<Element>(acc_s[mi][2 * np], a[mi], b0);
            mma_16816<Element>(acc_s[mi][2 * np + 1], a[mi], b1);
          }
        }
      }

      if (Has_score_mod || (Has_dropout && score_mod_on)) {
        const float slope = alibi_slope(p, b, h);
        const bool has_cap = p.softcap > 0.f;
        const float cap = p.softcap, inv_cap = has_cap ? 1.f / p.softcap : 0.f;
#pragma unroll
        for (int mi = 0; mi < kMFrags; ++mi)
#pragma unroll
          for (int ni = 0; ni < kNFragsS; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int dist = m0 + row_of(mi, e >> 1) + shift - (n0 + ni * 8 + 2 * t + (e & 1));
              acc_s[mi][ni][e] = score_mod(acc_s[mi][ni][e] * p.softmax_scale, has_cap, cap,
                                           inv_cap, slope, dist);
            }
      }
      // Masks only on blocks that cross the sequence end or a window edge.
      const bool need_mask = n0 + kBlockN > seq.seqlen_k ||
                             (p.window_right >= 0 && n0 + kBlockN - 1 > m0 + shift + p.window_right) ||
                             (p.window_left >= 0 && n0 < m_last + shift - p.window_left);
      if (need_mask) {
#pragma unroll
        for (int mi = 0; mi < kMFrags; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int i = m0 + row_of(mi, half);
            const int lo = mask.key_begin(i) - n0, hi = mask.key_end(i) - n0;
#pragma unroll
            for (int ni = 0; ni < kNFragsS; ++ni)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int j = ni * 8 + 2 * t + e;
                if (j < lo || j >= hi) acc_s[mi][ni][2 * half + e] = -INFINITY;
              }
          }
      }

      // Block-sparse units: the dropped blocks' units of a partial tile (row unit
      // mi * kNWarps + warp of this thread's rows, column unit ni / 2 of its columns).
      if (Is_sparse && unit_mode) {
        const unsigned long long um = unit_masks[block_of(it)];
        constexpr unsigned long long kAll = all_units_kept<kBlockM / 16, kBlockN / 16>();
        if ((um & kAll) != kAll) {
#pragma unroll
          for (int mi = 0; mi < kMFrags; ++mi) {
            const unsigned row_bits = static_cast<unsigned>(um >> (8 * (mi * kNWarps + warp)));
#pragma unroll
            for (int ni = 0; ni < kNFragsS; ++ni)
              if (!((row_bits >> (ni / 2)) & 1u)) {
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_s[mi][ni][e] = -INFINITY;
              }
          }
        }
      }

      // V(it) has landed; every warp is done with K(it), whose buffer K(it+kStages) refills.
      cp_async_wait<2 * (kStages - 1)>();
      __syncthreads();
      if (it + kStages < n_iters) load_k(it + kStages, unchecked);
      cp_async_commit();

      // Online softmax: new running max, rescale O and the sum, P = exp2(s*scale - max*scale).
      // A row with no visible key so far keeps max -inf; its shift is 0 so every p is 0.
      uint32_t pa[kMFrags][Traits::kKStepsPV][4];
#pragma unroll
      for (int mi = 0; mi < kMFrags; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = 2 * mi + half;
          float mx = row_max[r];
#pragma unroll
          for (int ni = 0; ni < kNFragsS; ++ni)
            mx = fmaxf(mx, fmaxf(acc_s[mi][ni][2 * half], acc_s[mi][ni][2 * half + 1]));
          mx = quad_max(mx);
          const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
          const float corr = fast_exp2(row_max[r] * scale_log2 - m_scaled);
          row_max[r] = mx;
          float sum = 0.f;
#pragma unroll
          for (int ni = 0; ni < kNFragsS; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pe = fast_exp2(acc_s[mi][ni][2 * half + e] * scale_log2 - m_scaled);
              acc_s[mi][ni][2 * half + e] = pe;
              sum += pe;
            }
          row_sum[r] = row_sum[r] * corr + sum;
#pragma unroll
          for (int ni = 0; ni < kNFragsO; ++ni) {
            acc_o[mi][ni][2 * half] *= corr;
            acc_o[mi][ni][2 * half + 1] *= corr;
          }
        }
      // Dropout: the sums above are the undropped softmax's (params.h); Z zeroes what P V
      // sees (the 1 / (1 - p) is applied to O at the end). Pairs of 16-column blocks share
      // one Philox call per lane (dropout_lanes.cuh).
      if (drop_on) {
        static_assert(!Has_dropout || kNFragsS % 4 == 0, "dropout pairs 16-column blocks");
#pragma unroll
        for (int mi = 0; mi < kMFrags; ++mi)
#pragma unroll
          for (int pp = 0; pp < kNFragsS / 4; ++pp) {
            uint32_t wa[2], wb[2];
            dropout_words_s<false>(rng, (m0 + mi * 16 * kNWarps + warp * 16) >> 4,
                                   (n0 >> 4) + 2 * pp, lane, wa, wb);
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
              for (int blk = 0; blk < 2; ++blk) {
                const uint32_t kept = dropout_kept4(rng, blk ? wb[half] : wa[half]);
#pragma unroll
                for (int n2 = 0; n2 < 2; ++n2)
#pragma unroll
                  for (int e = 0; e < 2; ++e) {
                    float& x = acc_s[mi][4 * pp + 2 * blk + n2][2 * half + e];
                    x = (kept >> (8 * (2 * n2 + e))) & 1u ? x : 0.f;
                  }
              }
          }
      }

      // P as the A operand: the m16n8 accumulators of n-tiles 2kk, 2kk+1 form one m16k16 tile.
#pragma unroll
      for (int mi = 0; mi < kMFrags; ++mi)
#pragma unroll
        for (int kk = 0; kk < Traits::kKStepsPV; ++kk) {
          pa[mi][kk][0] = pack2<Element>(acc_s[mi][2 * kk][0], acc_s[mi][2 * kk][1]);
          pa[mi][kk][1] = pack2<Element>(acc_s[mi][2 * kk][2], acc_s[mi][2 * kk][3]);
          pa[mi][kk][2] = pack2<Element>(acc_s[mi][2 * kk + 1][0], acc_s[mi][2 * kk + 1][1]);
          pa[mi][kk][3] = pack2<Element>(acc_s[mi][2 * kk + 1][2], acc_s[mi][2 * kk + 1][3]);
        }

      // O += P V (V^T fragments through ldmatrix.trans).
#pragma unroll
      for (int kk = 0; kk < Traits::kKStepsPV; ++kk)
#pragma unroll
        for (int dp = 0; dp < kNFragsO / 2; ++dp) {
          uint32_t bb[4];
          ldmatrix_x4_trans(bb, sVs + kv_off(v_lane, v_xor, kk * 16, 2 * dp));
          const uint32_t b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
#pragma unroll
          for (int mi = 0; mi < kMFrags; ++mi) {
            mma_16816<Element>(acc_o[mi][2 * dp], pa[mi][kk], b0);
            mma_16816<Element>(acc_o[mi][2 * dp + 1], pa[mi][kk], b1);
          }
        }
    }
    cp_async_wait<0>();
  }

  // Epilogue: O / rowsum through shared memory (the Q tile) for coalesced 16-byte stores;
  // lse = max*scale + ln(sum), -inf (and O = 0) for a row with no visible key; with a sink,
  // row_finish.h.
  __syncthreads();  // every warp is done reading Q / K / V tiles
  const float lse_scale = scale_log2 * kLn2;
  const float out_scale = drop_on ? p.dropout_scale : 1.f;
  const bool has_sink = p.sink_ptr != nullptr;
  const float sink = has_sink ? p.sink_ptr[h] : 0.f;
  float* lse = p.lse_ptr + b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0 + m0;
#pragma unroll
  for (int mi = 0; mi < kMFrags; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = 2 * mi + half;
      const float sum = quad_sum(row_sum[r]);
      const RowFinish fin = finish_row(sum, row_max[r] * lse_scale, has_sink, sink, out_scale);
      const float inv = fin.inv;
      const int row = row_of(mi, half);
      if (t == 0 && row < rows_q) lse[row] = fin.lse;
#pragma unroll
      for (int ni = 0; ni < kNFragsO; ++ni)
        st_shared_b32(sQ + TileQ::offset(row, ni) + 4 * t,
                      pack2<Element>(acc_o[mi][ni][2 * half] * inv,
                                     acc_o[mi][ni][2 * half + 1] * inv));
    }
  __syncthreads();

  using CopyQ = typename Traits::CopyQ;
  Element* o = static_cast<Element*>(p.o_ptr) + b * p.o_batch_stride +
               (seq.q_row0 + m0) * p.o_row_stride + h * p.o_head_stride;
  const int row0 = tid / CopyQ::kThreadsPerRow, chunk0 = tid % CopyQ::kThreadsPerRow;
#pragma unroll
  for (int c = 0; c < CopyQ::kColIters; ++c) {
    const int chunk = chunk0 + c * CopyQ::kThreadsPerRow;
    const int col = chunk * 8;
#pragma unroll
    for (int i = 0; i < CopyQ::kRowIters; ++i) {
      const int row = row0 + i * CopyQ::kRowsPerStep;
      if (row >= rows_q) continue;
      const uint4 val = ld_shared_v4(sQ + TileQ::offset(row, chunk));
      Element* dst = o + row * p.o_row_stride + col;
      if (Is_even_K || (vec_ok && col + 8 <= p.headdim_v)) {
        *reinterpret_cast<uint4*>(dst) = val;
      } else {
        const uint32_t w[4] = {val.x, val.y, val.z, val.w};
        auto* d16 = reinterpret_cast<uint16_t*>(dst);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (col + e < p.headdim_v) d16[e] = static_cast<uint16_t>(w[e >> 1] >> (16 * (e & 1)));
      }
    }
  }

  // Block-sparse varlen: the grid spans the mask's rows (launch_fwd_sm80.cuh), so a sequence's
  // rows past it (max_seqlen_q below its length) lie past the mask and keep nothing: out 0,
  // lse -inf (the sink with one), written by the last query block's CTA, a warp per row.
  if constexpr (Is_sparse) {
    const int64_t tail0 = int64_t(gridDim.x) * kBlockM;
    if (p.is_varlen && m_block == int(gridDim.x) - 1 && tail0 < seq.seqlen_q) {
      const float tail_lse = finish_row(0.f, 0.f, has_sink, sink, 1.f).lse;
      float* lse_seq = p.lse_ptr + b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0;
      for (int64_t r = tail0 + tid; r < seq.seqlen_q; r += Traits::kNThreads) lse_seq[r] = tail_lse;
      zero_rows_16bit(o - m0 * p.o_row_stride, p.o_row_stride, tail0, seq.seqlen_q, p.headdim_v,
                      warp, kNWarps, lane);
    }
  }
}

}  // namespace flashattn::sm80
