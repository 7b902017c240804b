// The FP8 forward's V^T made on chip (kernel_fwd_sm90.cuh's kVChip): the producer
// warpgroup's transposing warps, from the raw V ring that TMA fills into the V^T stage the
// consumers read (fp8_layout_sm90.h's column order).
#pragma once
#include <cstdint>

#include "../sm80/primitives_sm80.cuh"  // ldmatrix_x4_trans
#include "fp8_layout_sm90.h"
#include "fwd_config_sm90.cuh"
#include "primitives_bwd_sm90.cuh"
#include "primitives_sm90.cuh"
#include "tile_order_sm90.h"

namespace flashattn::sm90 {

// The transposing warps: warps 1-3 of the producer warpgroup (kernel_fwd_sm90.cuh's mbarrier
// counts of v_full and vraw_empty).
inline constexpr int kVtTransposers = 96;
#ifndef FLASHATTN_SM90_FP8_VCHIP_ILP
#define FLASHATTN_SM90_FP8_VCHIP_ILP 2
#endif

// kVChip (FP8): the transposing warps (tt < kVtTransposers) walk the tiles and key blocks the
// loading thread walks; per K / V slot: wait for the raw V stage (TMA) and for the consumers
// to have released the V^T stage's last use, write V^T (fp8_layout_sm90.h's column order: column 4 q
// + i holds key vt_key_of(4 q + i), so the four keys 32 g + 16 h + 2 t + {0, 1, 8, 9} of quad
// q = 8 g + 4 h + t land in one word), fence for the async proxy, release the raw stage and
// arrive on the V^T stage. A warp op (fp8_layout_sm90.h's vchip_*): one ldmatrix.x4.trans of
// 32 keys x 16 head-dim bytes, four byte permutes, one stmatrix.x4 into V^T; no bank
// conflicts. A stage's kOps ops are dealt round-robin to the three warps, two loads in flight
// before their permutes (FLASHATTN_SM90_FP8_VCHIP_ILP: 1 or 2). (The first form, 2026-12-04:
// 4-byte loads and stores, 16 bytes a lane a step, capped the kernel near 400 TFLOP/s on an
// H100: the transpose of a stage outlasted the consumers' step.)
template <class Cfg>
__device__ __forceinline__ void fwd_transpose_v(const FwdParams& p, uint8_t* smem,
                                                uint64_t* vraw_full, uint64_t* vraw_empty,
                                                uint64_t* v_full, uint64_t* v_empty, int tt,
                                                int num_tiles, int m_blocks, int group, int deal) {
  constexpr int kBN = Cfg::kBN, kDv = Cfg::kDv, kStages = Cfg::kStages;
  constexpr int kRawW = Cfg::kVRawChunkB, kVtW = Cfg::kVChunkB;
  constexpr int kGroups = kBN / 32, kOps = kGroups * (kDv / 16);  // warp ops a stage
  constexpr int kWarps = kVtTransposers / 32;
  constexpr int kIlp = FLASHATTN_SM90_FP8_VCHIP_ILP;
  static_assert(kBN % 32 == 0 && kDv % 16 == 0 && kRawW % 16 == 0 && kVtW % 32 == 0,
                "whole ops: 32 keys x 16 head-dim bytes, inside one chunk each way");
  static_assert(kIlp == 1 || kIlp == 2, "one or two ops in flight");
  const int lane = tt % 32, w = tt / 32;
  const uint32_t sel0 = vchip_sel(lane, 0), sel1 = vchip_sel(lane, 1);
  const VchipLane ln = vchip_lane(kRawW, kVtW, lane);
  int kv_count = 0;
  for (int k = 0;; ++k) {
    const int tile = fwd_tile_of(k, blockIdx.x, gridDim.x, num_tiles, m_blocks, deal);
    if (tile == kNoTile) break;
    if (tile == kSkipTile) continue;
    const FwdTileInfo ti = fwd_tile_info<Cfg::kBM, kBN>(p, tile, m_blocks, group);
    const int key_end = ti.si.seqlen_k - (ti.kbl.hi - 1) * kBN, n_iters = ti.n_iters;
    for (int it = 0; it < n_iters; ++it) {
      const int slot = kv_count + it, stage = slot % kStages, use = slot / kStages;
      mbar_wait(vraw_full + stage, use & 1);
      if (use > 0) mbar_wait(v_empty + stage, (use - 1) & 1);
      const uint32_t raw = smem_u32(smem + Cfg::kSmemVRaw + stage * Cfg::kVBytes);
      const uint32_t vt = smem_u32(smem + Cfg::kSmemV + stage * Cfg::kVBytes);
      // Keys past the sequence: zeros (varlen boxes hold the next sequence's rows there, whose
      // NaN codes would survive P = 0 in the MMA; padded ones are TMA's zero fill already).
      const int valid = key_end + it * kBN;
      // (A run-time loop over the warp's ops: unrolled, ptxas hoisted every op's addresses out
      // of the key-block loop and spilled ~400 bytes in the producer's 32-40 registers.)
#pragma unroll 1
      for (uint32_t op0 = w; op0 < uint32_t(kOps); op0 += kWarps * kIlp) {
        uint32_t r[kIlp][4];
#pragma unroll
        for (int u = 0; u < kIlp; ++u) {
          const uint32_t op = op0 + kWarps * u, g = op % kGroups, d0 = 16 * (op / kGroups);
          if (u == 0 || op < uint32_t(kOps))
            sm80::ldmatrix_x4_trans(r[u], raw + vchip_ld_off(ln, kRawW, Cfg::kVRawChunk, g, d0));
        }
#pragma unroll
        for (int u = 0; u < kIlp; ++u) {
          const uint32_t op = op0 + kWarps * u, g = op % kGroups, d0 = 16 * (op / kGroups);
          if (u > 0 && op >= uint32_t(kOps)) break;
          if (valid < kBN) {
#pragma unroll
            for (int j = 0; j < 4; ++j)
              r[u][j] = vchip_mask(r[u][j], 32 * int(g) + 8 * j + 2 * (lane % 4), valid);
          }
          stsm_x4(vt + vchip_st_off(ln, kVtW, Cfg::kVChunk, g, d0),
                  __byte_perm(r[u][0], r[u][1], sel0), __byte_perm(r[u][0], r[u][1], sel1),
                  __byte_perm(r[u][2], r[u][3], sel0), __byte_perm(r[u][2], r[u][3], sel1));
        }
      }
      fence_async_shared();  // the stores, for the consumers' WGMMAs (async proxy)
      mbar_arrive(vraw_empty + stage);
      mbar_arrive(v_full + stage);
    }
    kv_count += n_iters;
  }
}

}  // namespace flashattn::sm90
