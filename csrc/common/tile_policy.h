// Tile policy: which head-dim buckets have compiled kernels, and the tile shapes.
// Each choice carries its measured reason once measured on the H200 (benchmarks/results).
#pragma once

namespace flashattn {

// Head dims with compiled CUDA kernels. A head dim d runs in the smallest bucket >= d,
// loads beyond d masked to zero (flash-attn pads to a multiple of 8 in the same spirit).
// 160 and 224 are left out to keep the instantiation count small: they run as 192 / 256.
// The list is also read by tools/generate_instantiations.py (keep the format).
inline constexpr int kHeadDimBuckets[] = {32, 64, 96, 128, 192, 256};
inline constexpr int kNumHeadDimBuckets = sizeof(kHeadDimBuckets) / sizeof(int);
inline constexpr int kMaxHeadDim = 256;

// The bucket for a (qk, v) head-dim pair: one kernel dimension covers both.
constexpr int headdim_bucket(int d_qk, int d_v) {
  const int d = d_qk > d_v ? d_qk : d_v;
  for (int i = 0; i < kNumHeadDimBuckets; ++i)
    if (kHeadDimBuckets[i] >= d) return kHeadDimBuckets[i];
  return 0;  // over kMaxHeadDim: rejected by the API layer before any dispatch
}

}  // namespace flashattn
