// The FP8 forward's V^T made on chip (kernel_fwd_sm90.cuh's kVChip): the producer
// warpgroup's transposing warps, from the raw V ring that TMA fills into the V^T stage the
// consumers read (fp8_layout_sm90.h's column order).
#pragma once
#include <cstdint>

#include "fwd_config_sm90.cuh"
#include "primitives_bwd_sm90.cuh"
#include "primitives_sm90.cuh"
#include "tile_order_sm90.h"

namespace flashattn::sm90 {

// Byte b of row `row` of a tile of rows of W bytes (128 or 64) in TMA's W-byte swizzle (the
// 16-byte unit XORed with address bits 7-9, or 7-8: row % 8, or (row / 2) % 4).
template <int W>
__device__ __forceinline__ uint32_t swz_offset(int row, int b) {
  const int x = W == 128 ? row & 7 : (row >> 1) & 3;
  return uint32_t(row * W + ((((b >> 4) ^ x)) << 4) + (b & 15));
}

// kVChip (FP8): the transposing warps (tt < 96) walk the tiles and key blocks the loading
// thread walks; per K / V slot: wait for the raw V stage (TMA) and for the consumers to have
// released the V^T stage's last use, write V^T (fp8_layout_sm90.h's column order: column 4 q
// + i holds key vt_key_of(4 q + i), so the four keys 32 g + 16 h + 2 t + {0, 1, 8, 9} of quad
// q = 8 g + 4 h + t land in one word), fence for the async proxy, release the raw stage and
// arrive on the V^T stage. A warp step: 8 quads x 4 groups of 4 columns (4-byte loads of the
// quads' 4 keys, four byte permutes, four 4-byte stores: 2-way bank conflicts at most).
template <class Cfg>
__device__ __forceinline__ void fwd_transpose_v(const FwdParams& p, uint8_t* smem,
                                                uint64_t* vraw_full, uint64_t* vraw_empty,
                                                uint64_t* v_full, uint64_t* v_empty, int tt,
                                                int num_tiles, int m_blocks, int group, int deal) {
  constexpr int kBN = Cfg::kBN, kDv = Cfg::kDv, kStages = Cfg::kStages;
  constexpr int kQBlocks = kBN / 32, kSteps = kQBlocks * (kDv / 16);  // warp steps a stage
  const int lane = tt % 32, w = tt / 32;
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
      // Keys past the sequence: zeros (varlen boxes hold the next sequence's rows there, whose
      // NaN codes would survive P = 0 in the MMA; padded ones are TMA's zero fill already).
      const int valid = key_end + it * kBN;
      const uint32_t vt = smem_u32(smem + Cfg::kSmemV + stage * Cfg::kVBytes);
      for (int st = w; st < kSteps; st += 3) {
        const int q = 8 * (st % kQBlocks) + lane % 8, c0 = 4 * (4 * (st / kQBlocks) + lane / 8);
        const int k0 = 32 * (q / 8) + 16 * ((q / 4) % 2) + 2 * (q % 4);
        const uint32_t x_addr = raw + (c0 / Cfg::kVRawChunkB) * Cfg::kVRawChunk;
        uint32_t wd[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // keys k0, k0 + 1, k0 + 8, k0 + 9
          const int key = k0 + (j & 1) + 8 * (j >> 1);
          wd[j] = uint32_t(
              ld_shared_s32(x_addr + swz_offset<Cfg::kVRawChunkB>(key, c0 % Cfg::kVRawChunkB)));
          if (key >= valid) wd[j] = 0;
        }
        const uint32_t lo01 = __byte_perm(wd[0], wd[1], 0x5140), hi01 = __byte_perm(wd[0], wd[1], 0x7362);
        const uint32_t lo23 = __byte_perm(wd[2], wd[3], 0x5140), hi23 = __byte_perm(wd[2], wd[3], 0x7362);
        const uint32_t out[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                                 __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
        const int col = 4 * q;  // V^T column of the quad's first key
        const uint32_t y_addr = vt + (col / Cfg::kVChunkB) * Cfg::kVChunk;
#pragma unroll
        for (int i = 0; i < 4; ++i)  // head-dim column c0 + i
          sts_u32(y_addr + swz_offset<Cfg::kVChunkB>(c0 + i, col % Cfg::kVChunkB), out[i]);
      }
      fence_async_shared();  // the stores, for the consumers' WGMMAs (async proxy)
      mbar_arrive(vraw_empty + stage);
      mbar_arrive(v_full + stage);
    }
    kv_count += n_iters;
  }
}

}  // namespace flashattn::sm90
