// Tile policy of the Hopper forward: which head dims have sm90 kernels, and their tiles.
// Each choice with its measured reason (H200; tools/selftest/selftest_fwd_sm90,
// benchmarks/NOTES.md).
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

// d128: 128 query rows (two consumer warpgroups of 64) x 128 keys, one producer warpgroup, a
// 2-stage ring each for K and V (3 stages: no gain, 565 vs 609 at 16k in the self-test).
constexpr FwdTile fwd_tile(int head_dim) {
  return head_dim == 128 ? FwdTile{128, 128, FLASHATTN_SM90_FWD_STAGES, 384} : FwdTile{0, 0, 0, 0};
}

// The consumer schedule (kernel_fwd_sm90.cuh: 1 intra-warpgroup overlap, 2 overlap + ping-pong
// between the two consumer warpgroups). Package benchmark, d128 16k nc / causal: serial 539 /
// 525, ping-pong 606 / 606 TFLOP/s; the self-test had overlap ahead at 8k-16k (one run).
#ifndef FLASHATTN_SM90_FWD_SCHEDULE
#define FLASHATTN_SM90_FWD_SCHEDULE 2
#endif
constexpr int fwd_schedule(int /*head_dim*/) { return FLASHATTN_SM90_FWD_SCHEDULE; }

}  // namespace flashattn::sm90
