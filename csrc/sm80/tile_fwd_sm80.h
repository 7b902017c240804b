// Tile policy of the sm80 forward kernel, per head-dim bucket. Constraints: registers (the
// fp32 O accumulator of kBlockM x kHeadDim and the S tile of kBlockM x kBlockN live in the
// registers of kNWarps warps), shared memory (Q + kStages x (K + V) tiles), and occupancy.
#pragma once

namespace flashattn::sm80 {

struct FwdTile {
  int block_m;       // query rows per CTA
  int block_n;       // keys per K/V tile
  int warps;         // each warp owns block_m / warps query rows (16 or 32)
  int stages;        // smem buffers each for K and V (1 = FA2's scheme: the K load overlaps
                     // softmax + P V, the V load overlaps Q K^T; 2 = both prefetched a block ahead)
  int min_blocks;    // __launch_bounds__ min CTAs per SM (2 = at most 255 regs/thread at 4 warps)
};

// Choices (H200, bf16, hidden 2048, timed side by side with tools/selftest/selftest_fwd_sm80.cu
// --variants, 2026-11-29; medians of 15 launches):
//  d <= 64 : 128 x 128, 4 warps (32 rows/warp): each K fragment feeds two MMAs. 128 x 64 was
//            6% slower; one K/V stage was within 1% of two.
//  d 96/128: 128 x 64, 4 warps: O takes 96/128 regs/thread, S 64; 2 CTAs/SM by registers.
//            At d = 128: 64 x 64 (3 CTAs/SM) was 15% slower, 128 x 32 6-8% slower; one K/V
//            stage tied with two (343 vs 343 TFLOP/s at N = 2k).
//  d 192/256: 128 x 64, 8 warps (16 rows/warp), so O stays <= 128 regs/thread; 1 CTA/SM.
//            At d = 256 it beat 64 x 64 x 4 warps (FA2's H100 choice, 2 CTAs/SM) by 8% at
//            large N (64 x 64 is used up to 2k keys: launch_fwd_sm80.cuh), and one K/V
//            stage (FA2's K/V interleaving, 128 KiB) beat two (192 KiB) by 1-2.5%.
constexpr FwdTile fwd_tile(int hdim) {
  return hdim <= 64    ? FwdTile{128, 128, 4, 2, 2}
         : hdim <= 128 ? FwdTile{128, 64, 4, 2, 2}
                       : FwdTile{128, 64, 8, 1, 1};
}

// For GPUs whose per-block shared memory is below fwd_tile's (sm_86/89: 99 KiB): a shape of at
// most 96 KiB, used when the primary one does not fit (only d = 256 needs one: 128 KiB).
constexpr FwdTile fwd_tile_small_smem(int hdim) {
  return hdim <= 192 ? fwd_tile(hdim)              // <= 96 KiB already
                     : FwdTile{64, 64, 4, 1, 2};   // 96 KiB
}

}  // namespace flashattn::sm80
