// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
// Random123 constants) and the dropout mask of params.h, one definition for every backend.
// Torch-free, host and device.
//
// Counter layout: one Philox call gives the 16 keep bytes of row i, columns [16 g, 16 g + 16)
// of (batch b, head h):
//   counter = {g, i, lo32(offset) + h, hi32(offset) + b},  key = {lo32(seed), hi32(seed)}
// and column 16 g + c reads byte 2 * (c / 8) + c % 2 of word (c % 8) / 2. So word w holds
// columns {2w, 2w + 1, 8 + 2w, 9 + 2w}: in the mma.sync / WGMMA accumulator layout (a row's
// columns spread over the 4 threads of a quad, two adjacent ones per 8-column block), thread
// t of a quad owns word t of each 16-column group of its rows; a quad makes its 4 calls (one
// each) and swaps words with 3 shuffles, FA2's cost of one call per 16 elements.
#pragma once
#include <cstdint>

#include "seqlen.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn {

struct Philox4 {
  uint32_t x[4];
};

FLASHATTN_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  lo = a * b;
  hi = __umulhi(a, b);
#else
  const uint64_t prod = static_cast<uint64_t>(a) * b;
  lo = static_cast<uint32_t>(prod);
  hi = static_cast<uint32_t>(prod >> 32);
#endif
}

// Philox4x32 with 10 rounds: the key is bumped by the Weyl constants between rounds.
FLASHATTN_HOST_DEVICE Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                             uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c0, hi0, lo0);
    philox_mulhilo(kM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    k0 += kW0, k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The 16 keep bytes of row i, columns [16 g, 16 g + 16) of (b, h) (layout above).
FLASHATTN_HOST_DEVICE Philox4 dropout_bits(uint64_t seed, uint64_t offset, int32_t b, int32_t h,
                                           int32_t i, int32_t g) {
  return philox4x32_10(static_cast<uint32_t>(g), static_cast<uint32_t>(i),
                       static_cast<uint32_t>(offset) + static_cast<uint32_t>(h),
                       static_cast<uint32_t>(offset >> 32) + static_cast<uint32_t>(b),
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The byte of column 16 g + c (0 <= c < 16) in dropout_bits(..., g).
FLASHATTN_HOST_DEVICE uint32_t dropout_byte(const Philox4& r, int c) {
  return (r.x[(c & 7) >> 1] >> (8 * (2 * (c >> 3) + (c & 1)))) & 0xffu;
}

// params.h's rule: p quantised to threshold / 256, threshold = max(1, round(p * 256)) capped
// at 255 for 0 < p < 1 (so a tiny p still drops something), 0 = no dropout.
FLASHATTN_HOST_DEVICE uint32_t dropout_threshold_u8(float p) {
  if (!(p > 0.f)) return 0;
  const float t = p * 256.f + 0.5f;
  return t < 1.f ? 1u : (t >= 255.f ? 255u : static_cast<uint32_t>(t));
}

// Z_ij of params.h: true iff column j of row i of (b, h) is kept.
FLASHATTN_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, int32_t b, int32_t h,
                                        int32_t i, int32_t j, uint32_t threshold) {
  return dropout_byte(dropout_bits(seed, offset, b, h, i, j >> 4), j & 15) >= threshold;
}

}  // namespace flashattn
