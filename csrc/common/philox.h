// Philox4x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
// Random123 constants) and the dropout mask of params.h, one definition for every backend.
// Torch-free, host and device. The mask takes kPhiloxRounds = 7 rounds, as flash-attn's,
// PyTorch's and Composable Kernel's dropout do (Philox4x32-7 passes TestU01's BigCrush in the
// paper; 10 is Random123's default margin): the Philox is most of a dropout kernel's added
// instructions, and 7 rounds take 30% fewer than 10 (until 2026-12-06 the mask took 10).
//
// Layout: the (query row i, key column j) plane of (batch b, head h) is cut into 16 x 16
// blocks (I, J) = (i >> 4, j >> 4); within a block (r, c) = (i & 15, j & 15). One Philox call
// gives the 16 keep bytes of one "unit" u = 4 q + t of a block, the cells
//   rows {2q, 2q + 1, 2q + 8, 2q + 9} x columns {2t, 2t + 1, 2t + 8, 2t + 9}   (q, t < 4):
//   counter = {J, 16 I + u, lo32(offset) + h, hi32(offset) + b},  key = {lo32(seed), hi32(seed)}
// cell (r, c) is byte ((c >> 3) << 1) | (c & 1) of word ((r & 1) << 1) | (r >> 3).
// Why this shape: a unit is what two lanes of a warp hold of a 16 x 16 block both in the
// mma.sync / WGMMA accumulator layout of S (the forward: lane (g, t) holds rows {g, g + 8},
// columns {2t, 2t + 1, 2t + 8, 2t + 9}; lanes g and g ^ 1 share unit (g >> 1, t)) and in that
// of S^T (the backward: lane (k, q) holds query rows {2q, 2q + 1, 2q + 8, 2q + 9}, key columns
// {k, k + 8}; lanes k and k ^ 1 share unit (q, k >> 1)). So each lane makes one call per two
// blocks it holds and swaps half of it with lane ^ 4 (2 shuffles): one call per 16 elements,
// in either orientation. Rows or columns past 2^28 wrap the counter (the mask repeats).
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

inline constexpr int kPhiloxRounds = 7;

// Philox4x32 with kRounds rounds: the key is bumped by the Weyl constants between rounds.
template <int kRounds>
FLASHATTN_HOST_DEVICE Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                         uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < kRounds; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c0, hi0, lo0);
    philox_mulhilo(kM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    k0 += kW0, k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The 16 keep bytes of unit u of block (I, J) of (b, h) (layout above).
FLASHATTN_HOST_DEVICE Philox4 dropout_bits(uint64_t seed, uint64_t offset, int32_t b, int32_t h,
                                           int32_t I, int32_t J, int32_t u) {
  return philox4x32<kPhiloxRounds>(static_cast<uint32_t>(J),
                                   static_cast<uint32_t>(I) * 16u + static_cast<uint32_t>(u),
                                   static_cast<uint32_t>(offset) + static_cast<uint32_t>(h),
                                   static_cast<uint32_t>(offset >> 32) + static_cast<uint32_t>(b),
                                   static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Within-block coordinates (r, c) -> the unit, word and byte that hold the cell.
FLASHATTN_HOST_DEVICE int dropout_unit(int r, int c) { return ((r >> 1) & 3) * 4 + ((c >> 1) & 3); }
FLASHATTN_HOST_DEVICE int dropout_word(int r) { return ((r & 1) << 1) | (r >> 3); }
FLASHATTN_HOST_DEVICE int dropout_byte_in_word(int c) { return ((c >> 3) << 1) | (c & 1); }

// params.h's rule: p quantised to threshold / 256, threshold = max(1, round(p * 256)) capped
// at 255 for 0 < p < 1 (so a tiny p still drops something), 0 = no dropout.
FLASHATTN_HOST_DEVICE uint32_t dropout_threshold_u8(float p) {
  if (!(p > 0.f)) return 0;
  const float t = p * 256.f + 0.5f;
  return t < 1.f ? 1u : (t >= 255.f ? 255u : static_cast<uint32_t>(t));
}

// The Philox byte of column j of row i of (b, h) (one call for the one cell; the word picked
// by selects, no indexed array: device code keeps it in registers).
FLASHATTN_HOST_DEVICE uint32_t dropout_byte(uint64_t seed, uint64_t offset, int32_t b, int32_t h,
                                            int32_t i, int32_t j) {
  const int r = i & 15, c = j & 15, w = dropout_word(r);
  const Philox4 x = dropout_bits(seed, offset, b, h, i >> 4, j >> 4, dropout_unit(r, c));
  const uint32_t word = w == 0 ? x.x[0] : w == 1 ? x.x[1] : w == 2 ? x.x[2] : x.x[3];
  return (word >> (8 * dropout_byte_in_word(c))) & 0xffu;
}

// Z_ij of params.h: true iff column j of row i of (b, h) is kept.
FLASHATTN_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, int32_t b, int32_t h,
                                        int32_t i, int32_t j, uint32_t threshold) {
  return dropout_byte(seed, offset, b, h, i, j) >= threshold;
}

}  // namespace flashattn
