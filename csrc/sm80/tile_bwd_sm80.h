// Tile shapes of the sm80 backward, per head-dim bucket. CUDA-free so that the dispatcher
// can size the workspace from them. Warp layouts: SdP = the S^T / dP^T tiles (key rows x
// query cols), dKV = the dK / dV accumulators (key rows x head dim), dQ = (query rows x dim).
#pragma once
#include <cstdint>
#include "../common/params.h"
#include "../common/seqlen.h"
#include "../common/tile_policy.h"

namespace flashattn::sm80 {

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kWarpsNSdP_,
          int kWarpsNdKV_, int kWarpsMdQ_>
struct BwdTile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = kBlockN_;  // key rows per CTA
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kStages = 2;  // Q / dO / LSE / D double-buffered with cp.async

  static constexpr int kWarpsNSdP = kWarpsNSdP_, kWarpsMSdP = kNWarps / kWarpsNSdP_;
  static constexpr int kWarpsNdKV = kWarpsNdKV_, kWarpsDdKV = kNWarps / kWarpsNdKV_;
  static constexpr int kWarpsMdQ = kWarpsMdQ_, kWarpsDdQ = kNWarps / kWarpsMdQ_;
  static constexpr int kTileNSdP = kBlockN / kWarpsNSdP, kTileMSdP = kBlockM / kWarpsMSdP;
  static constexpr int kTileNdKV = kBlockN / kWarpsNdKV, kTileDdKV = kHeadDim / kWarpsDdKV;
  static constexpr int kTileMdQ = kBlockM / kWarpsMdQ, kTileDdQ = kHeadDim / kWarpsDdQ;

  // P^T and dS^T stay in registers for dV / dK when each warp owns whole key rows in both
  // layouts (no smem round trip for P); dS^T still goes to smem for dQ.
  static constexpr bool kPInRegs =
      kWarpsMSdP == 1 && kWarpsDdKV == 1 && kWarpsNSdP == kWarpsNdKV;

  static_assert(kTileNSdP % 16 == 0 && kTileMSdP % 16 == 0, "SdP warp tile: 16-multiples");
  static_assert(kTileNdKV % 16 == 0 && kTileDdKV % 16 == 0, "dKV warp tile: 16-multiples");
  static_assert(kTileMdQ % 16 == 0 && kTileDdQ % 16 == 0, "dQ warp tile: 16-multiples");
  static_assert(kBlockM <= kThreads, "one thread per query row loads LSE / D");
  static_assert(kNWarps % kWarpsNSdP == 0 && kNWarps % kWarpsNdKV == 0 &&
                    kNWarps % kWarpsMdQ == 0, "warp layouts must use every warp");

  // Shared memory, in elements of the 16-bit type unless noted.
  static constexpr int kSmemQ = kStages * kBlockM * kHeadDim;
  static constexpr int kSmemdO = kStages * kBlockM * kHeadDim;
  static constexpr int kSmemK = kBlockN * kHeadDim;
  static constexpr int kSmemV = kBlockN * kHeadDim;
  static constexpr int kSmemdS = kBlockN * kBlockM;
  static constexpr int kSmemP = kPInRegs ? 0 : kBlockN * kBlockM;
  static constexpr int kSmemElems = kSmemQ + kSmemdO + kSmemK + kSmemV + kSmemdS + kSmemP;
  static constexpr int kSmemBytes = kSmemElems * 2 + 2 * kStages * kBlockM * 4;  // + LSE, D
};

// Measured on the H200 (bf16, hidden 2048, tools/selftest/selftest_bwd_sm80, 2026-11-29), TFLOP/s
// at N = 8192 non-causal / causal, with the masking and alignment tests hoisted out of the
// element / chunk loops (kernel_bwd_sm80.cuh):
//   d128: FA2's layouts below (P^T and dS^T through smem, 32x32 S^T warp tiles) 272 / 249;
//         S^T first and the ex2 before the dP^T GEMM (FA2's order) 262 / 241; that plus
//         the dQ GEMM and atomics before dV / dK 253 / 233. Before the hoisting: every warp
//         owning 16 whole key rows with P^T kept in registers 214 / 199 against 234 / 217
//         (176 ldmatrix.x4 per warp and step against 144); 4 warps x 64 keys, 2 CTAs/SM
//         173 / 168.
//   d64:  BM = 128 (below) 239 / 224; BM = 64 219 / 203 (before the hoisting BM = 64 led,
//         192 / 179 against 184 / 173). Deterministic mode at N = 4096: 208 against 173.
// d32 / d96 follow d64 / d128 (unmeasured). d >= 192: 64 / 32-row tiles keep smem within
// the A100's 163 KB at 2 stages (d256: 159 / 146 TFLOP/s at N = 4096).
template <int kHeadDim> struct BwdTileFor;
template <> struct BwdTileFor<32> { using type = BwdTile<32, 128, 128, 8, 4, 4, 4>; };
template <> struct BwdTileFor<64> { using type = BwdTile<64, 128, 128, 8, 4, 4, 4>; };
template <> struct BwdTileFor<96> { using type = BwdTile<96, 64, 128, 8, 4, 4, 4>; };
template <> struct BwdTileFor<128> { using type = BwdTile<128, 64, 128, 8, 4, 4, 2>; };
template <> struct BwdTileFor<192> { using type = BwdTile<192, 64, 64, 8, 4, 4, 2>; };
template <> struct BwdTileFor<256> { using type = BwdTile<256, 32, 64, 8, 4, 4, 2>; };

// A larger tile where the GPU's opt-in smem holds it (sm90), chosen at launch.
// d256: 64 x 64 (209 KB) against the A100's 32 x 64: H200 bf16 +18-25% (N 512-8k, causal
// too; `selftest_bwd --tiles256`, benchmarks/NOTES.md).
template <int kHeadDim> struct BwdTileLargeSmem {
  using type = typename BwdTileFor<kHeadDim>::type;
};
template <> struct BwdTileLargeSmem<256> { using type = BwdTile<256, 64, 64, 8, 4, 2, 2>; };

// For GPUs whose opt-in smem is below BwdTileFor's (sm_86 / sm_89: 99 KB), chosen at launch.
// Checked on the H200 by `selftest_bwd --tiles` (non-causal 8k TFLOP/s: d32 168, d64 233, d96
// 172, d128 159, d192 146); the package path by tests/test_cuda.py under FLASHATTN_SMEM_LIMIT.
// d256 has none (FA2 keeps V in registers there; ours spill): a named error on those GPUs.
template <int kHeadDim> struct BwdTileSmallSmem {
  using type = typename BwdTileFor<kHeadDim>::type;
};
// smem 66 / 97 / 89 / 73 / 77 KB:
template <> struct BwdTileSmallSmem<32> { using type = BwdTile<32, 64, 128, 8, 4, 4, 4>; };
template <> struct BwdTileSmallSmem<64> { using type = BwdTile<64, 64, 128, 8, 4, 4, 4>; };
template <> struct BwdTileSmallSmem<96> { using type = BwdTile<96, 64, 64, 8, 4, 4, 4>; };
template <> struct BwdTileSmallSmem<128> { using type = BwdTile<128, 32, 64, 8, 4, 4, 2>; };
template <> struct BwdTileSmallSmem<192> { using type = BwdTile<192, 32, 32, 4, 2, 1, 2>; };
static_assert(BwdTileSmallSmem<32>::type::kSmemBytes <= 99 * 1024 &&
                  BwdTileSmallSmem<64>::type::kSmemBytes <= 99 * 1024 &&
                  BwdTileSmallSmem<96>::type::kSmemBytes <= 99 * 1024 &&
                  BwdTileSmallSmem<128>::type::kSmemBytes <= 99 * 1024 &&
                  BwdTileSmallSmem<192>::type::kSmemBytes <= 99 * 1024,
              "the small-smem tiles must fit sm_86 / sm_89's 99 KB per block");

// Block sizes by bucket, for the workspace sizing on the host: the smallest kBlockM (n =
// false) or kBlockN (n = true) over the bucket's tiles, so the semaphores fit any of them.
template <int kHeadDim>
constexpr int bwd_min_block(bool n) {
  using A = typename BwdTileFor<kHeadDim>::type;
  using L = typename BwdTileLargeSmem<kHeadDim>::type;
  using S = typename BwdTileSmallSmem<kHeadDim>::type;
  const int a = n ? A::kBlockN : A::kBlockM, l = n ? L::kBlockN : L::kBlockM;
  const int s = n ? S::kBlockN : S::kBlockM, al = a < l ? a : l;
  return al < s ? al : s;
}
constexpr int bwd_min_block(int bucket, bool n) {
  return bucket == 32 ? bwd_min_block<32>(n) : bucket == 64 ? bwd_min_block<64>(n)
       : bucket == 96 ? bwd_min_block<96>(n) : bucket == 128 ? bwd_min_block<128>(n)
       : bucket == 192 ? bwd_min_block<192>(n) : bwd_min_block<256>(n);
}
constexpr int bwd_block_m(int bucket) { return bwd_min_block(bucket, false); }
constexpr int bwd_block_n(int bucket) { return bwd_min_block(bucket, true); }

// Workspace layout (offsets in elements, -1 = absent), shared by bwd_workspace() and the
// launcher. fp32: dq_accum [total_q][nheads][bucket], then for GQA dk_accum and dv_accum
// [total_k][nheads_k][bucket]. int32 (deterministic only): dq_sem [batch][nheads][m_blocks],
// then for GQA dkv_sem [batch][nheads_k][n_blocks]. All must start zeroed.
struct BwdWorkspaceLayout {
  int64_t dq_accum = 0, dk_accum = -1, dv_accum = -1, f32_elems = 0;
  int64_t dq_sem = -1, dkv_sem = -1, i32_elems = 0;
  int m_blocks = 0, n_blocks = 0;
};

// Sized for query / key blocks of bm / bn rows (the bucket's: the overload below).
inline BwdWorkspaceLayout bwd_workspace_layout(const BwdParams& p, int bucket, int bm, int bn) {
  BwdWorkspaceLayout w;
  // The grid's extents: max_seqlen, or a block-sparse varlen mask's rows (seqlen.h).
  const bool sparse = p.q_num_blocks != nullptr;
  w.m_blocks = (mask_rows_q(p, sparse) + bm - 1) / bm;
  w.n_blocks = (mask_rows_k(p, sparse) + bn - 1) / bn;
  const bool gqa = p.nheads != p.nheads_k;
  w.f32_elems = p.total_q * p.nheads * bucket;
  if (gqa) {
    w.dk_accum = w.f32_elems;
    w.dv_accum = w.dk_accum + p.total_k * p.nheads_k * bucket;
    w.f32_elems = w.dv_accum + p.total_k * p.nheads_k * bucket;
  }
  if (p.deterministic) {
    w.dq_sem = 0;
    w.i32_elems = int64_t(p.batch) * p.nheads * w.m_blocks;
    if (gqa) {
      w.dkv_sem = w.i32_elems;
      w.i32_elems += int64_t(p.batch) * p.nheads_k * w.n_blocks;
    }
  }
  return w;
}

inline BwdWorkspaceLayout bwd_workspace_layout(const BwdParams& p, int bucket) {
  return bwd_workspace_layout(p, bucket, bwd_block_m(bucket), bwd_block_n(bucket));
}

}  // namespace flashattn::sm80
