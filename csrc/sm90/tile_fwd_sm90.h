// Tile policy of the Hopper forward: which head dims have sm90 kernels, and their tiles.
// Each choice with its measured reason (H200, tools/selftest_fwd_sm90.cu; benchmarks/NOTES.md).
#pragma once

#ifndef FLASHATTN_SM90_FWD_STAGES  // K / V ring depth (3 fits: 225 KB of shared memory; untimed)
#define FLASHATTN_SM90_FWD_STAGES 2
#endif

namespace flashattn::sm90 {

// Head dims (qk = v) with an sm90 forward, a subset of kHeadDimBuckets; other head dims run on
// sm80. Read by tools/generate_instantiations.py (keep the format).
inline constexpr int kFwdHeadDims[] = {128};

struct FwdTile {
  int block_m, block_n, stages, threads;
};

// d128: 128 query rows (two consumer warpgroups of 64) x 128 keys, one producer warpgroup:
// 610 / 608 TFLOP/s at 16k non-causal / causal, 1.7x the sm80 kernel. The intra-warpgroup
// overlap (458 / 525) and grid-wide heavy-first (488 / 456) were slower and are gone (git).
constexpr FwdTile fwd_tile(int head_dim) {
  return head_dim == 128 ? FwdTile{128, 128, FLASHATTN_SM90_FWD_STAGES, 384} : FwdTile{0, 0, 0, 0};
}

// The consumer schedule (kernel_fwd_sm90.cuh: 0 serial, 1 intra-warpgroup overlap, 2 overlap
// + ping-pong between the two consumer warpgroups).
#ifndef FLASHATTN_SM90_FWD_SCHEDULE
#define FLASHATTN_SM90_FWD_SCHEDULE 2
#endif
constexpr int fwd_schedule(int /*head_dim*/) { return FLASHATTN_SM90_FWD_SCHEDULE; }

}  // namespace flashattn::sm90
