// Dropout's keep bytes (params.h, philox.h) as the lanes of a warp hold score tiles, for the
// CUDA kernels (sm80, sm90). A 16 x 16 block of the (query, key) plane is 16 Philox units; in
// both accumulator orientations lanes L and L ^ 4 hold the same unit of a block (philox.h), so
// a lane pair splits two blocks A, B: the even lane of the pair draws A, the odd one B, and
// they swap the halves the other holds (2 shuffles per lane and pair of blocks).
// Position offsets (params.h, issue 17): the kernels pass block indices of the call's own
// (local) rows and key columns; the mask is that of (i + qo, j + ko). Offsets that are both
// multiples of 16 shift whole blocks (the same one call per 16 cells). Any other offsets take
// the cell-by-cell path below (kCells: one call per cell, 16x the Philox work, the same
// bytes). The sm90 kernels come as two kernels, kCells false and true: a dropout call with
// offsets launches both (dropout_offsets_call) and each CTA of the one that does not match
// returns at its start (dropout_cells_call); other calls launch the first alone. The cell
// path's code in the same body cost the whole-block calls 5-18% (an H100 A/B, 2026-12-06), and
// in the same kernel as a second body 15-40% in the backward (508 bytes of spills at d 128
// instead of ~100): ptxas allocates a kernel's registers once. The sm80 kernels never
// see offsets with dropout (backend_choice.h refuses them: second bodies there made the build
// too slow); they pass kCells = false and zero offsets.
#pragma once
#include <cstdint>

#include "mask.h"
#include "params.h"
#include "philox.h"

namespace flashattn {

struct DropoutRng {
  uint64_t seed, offset;
  uint32_t threshold4;  // the 8-bit threshold in every byte (for __vcmpgeu4)
  int32_t b, h;
  int32_t qo = 0, ko = 0;  // the sequence's position offsets (clamped, mask.h), 0 without
};

__device__ __forceinline__ DropoutRng dropout_rng(const int64_t* rng_state, uint32_t threshold,
                                                  int b, int h, int32_t qo, int32_t ko) {
  return DropoutRng{static_cast<uint64_t>(rng_state[0]), static_cast<uint64_t>(rng_state[1]),
                    threshold * 0x01010101u, b, h, qo, ko};
}

// Whether some sequence's position offsets are not multiples of 16 (the call then takes the
// cell-by-cell path). Every thread of the CTA calls it (a barrier), before any role split.
__device__ __forceinline__ bool dropout_cells_call(const FwdParams& p) {
  if (p.dropout_threshold == 0 || (p.q_pos_offset == nullptr && p.k_pos_offset == nullptr))
    return false;
  int odd = 0;
  for (int b = threadIdx.x; b < p.batch; b += blockDim.x)
    odd |= (q_pos_of(p, b) | k_pos_of(p, b)) & 15;
  return __syncthreads_or(odd) != 0;
}

// The cell-by-cell path: the first `words` (2 or 4) keep words, byte e of word k the cell
// below of the offset plane (philox.h's dropout_byte), one Philox call per cell in a loop that
// is not unrolled (one copy of the Philox rounds per call site). kind 0: S, blocks A = (I, J),
// B = (I, J + 1) (dropout_words_s: word k row g + 8 (k & 1) of block A (k < 2) or B, byte e
// column 8 (e >> 1) + 2t + (e & 1)); kind 1: S^T, blocks A = (I, J), B = (I2, J2)
// (dropout_words_st: word k query row 8 (e >> 1) + 2q + (k & 1) of block A (k < 2) or B, key
// column k' + 8 (e & 1), k' = lane / 4).
struct DropoutWords4 {
  uint32_t w[4];
};
__device__ __forceinline__ DropoutWords4 dropout_words_cells(const DropoutRng& r, int kind,
                                                             int words, int lane, int I, int J,
                                                             int I2, int J2) {
  DropoutWords4 out{{0u, 0u, 0u, 0u}};
  const int hi = lane >> 2, lo = lane & 3;
#pragma unroll 1
  for (int n = 0; n < 4 * words; ++n) {
    const int k = n >> 2, e = n & 3;
    int i, j;
    if (kind == 0) {
      i = I * 16 + hi + 8 * (k & 1);
      j = (J + (k >> 1)) * 16 + 8 * (e >> 1) + 2 * lo + (e & 1);
    } else {
      i = (k >> 1 ? I2 : I) * 16 + 8 * (e >> 1) + 2 * lo + (k & 1);
      j = (k >> 1 ? J2 : J) * 16 + hi + 8 * (e & 1);
    }
    const uint32_t v = dropout_byte(r.seed, r.offset, r.b, r.h, i + r.qo, j + r.ko) << (8 * e);
#pragma unroll
    for (int x = 0; x < 4; ++x) out.w[x] |= k == x ? v : 0u;
  }
  return out;
}

// 0xff in each byte whose Philox byte keeps its cell, 0 where dropped.
__device__ __forceinline__ uint32_t dropout_kept4(const DropoutRng& r, uint32_t word) {
  return __vcmpgeu4(word, r.threshold4);
}

// The same as 16-bit masks, for a packed 16-bit P: m01 0xffff in its low / high half where
// byte 0 / 1 of `word` keeps its cell, m23 likewise for bytes 2 / 3. Each byte b becomes the
// fp16 0x3C00 | b (1 + b / 1024: exact, monotone in b) and one HSET2 compares two of them with
// the threshold's: 2 PRMT + 2 HSET2 a word, where __vcmpgeu4 and two widening PRMT took 7.
// Used by the sm90 forward (FLASHATTN_SM90_DROPOUT_HSET2, a build switch: on since its tests
// passed on an H100 and the build A/B ran the dropout forward 1.02-1.08x the __vcmpgeu4 form,
// 2026-12-06, benchmarks/results/h100_20261206d.txt; =0 builds the old form).
#ifndef FLASHATTN_SM90_DROPOUT_HSET2
#define FLASHATTN_SM90_DROPOUT_HSET2 1
#endif
__device__ __forceinline__ void dropout_kept16(const DropoutRng& r, uint32_t word, uint32_t& m01,
                                               uint32_t& m23) {
  const uint32_t thr = 0x3C003C00u | (r.threshold4 & 0xffu) * 0x00010001u;
  const uint32_t h01 = __byte_perm(word, 0x3C3C3C3Cu, 0x5140u);
  const uint32_t h23 = __byte_perm(word, 0x3C3C3C3Cu, 0x7362u);
  asm("set.ge.u32.f16x2 %0, %1, %2;" : "=r"(m01) : "r"(h01), "r"(thr));
  asm("set.ge.u32.f16x2 %0, %1, %2;" : "=r"(m23) : "r"(h23), "r"(thr));
}

// S orientation (forward; rows = queries): lane (g = lane / 4, t = lane % 4) holds rows
// {g, g + 8} and columns {2t, 2t + 1, 2t + 8, 2t + 9} of a block, unit (g / 2, t). Blocks A =
// (I, J) and B = (I, J + 1). On return a[half] / b[half]: the keep word of row g + 8 half in
// A / B, whose byte (ni & 1) * 2 + e is column (ni & 1) * 8 + 2t + e (ni the n8 tile).
template <bool kCells>
__device__ __forceinline__ void dropout_words_s(const DropoutRng& r, int I, int J, int lane,
                                                uint32_t (&a)[2], uint32_t (&b)[2]) {
  const int g = lane >> 2, t = lane & 3;
  if constexpr (kCells) {
    const DropoutWords4 x = dropout_words_cells(r, 0, 4, lane, I, J, I, J + 1);
    a[0] = x.w[0], a[1] = x.w[1], b[0] = x.w[2], b[1] = x.w[3];
    return;
  }
  I += r.qo >> 4, J += r.ko >> 4;
  const bool odd = g & 1;
  const Philox4 x = dropout_bits(r.seed, r.offset, r.b, r.h, I, J + (odd ? 1 : 0),
                                 (g >> 1) * 4 + t);
  // Rows g (word 2 (g & 1)) and g + 8 (word 2 (g & 1) + 1): the even lane keeps words 0, 1
  // of A and sends 2, 3; the odd lane keeps 2, 3 of B and sends 0, 1.
  const uint32_t s0 = odd ? x.x[0] : x.x[2], s1 = odd ? x.x[1] : x.x[3];
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, s0, 4);
  const uint32_t r1 = __shfl_xor_sync(0xffffffffu, s1, 4);
  a[0] = odd ? r0 : x.x[0];
  a[1] = odd ? r1 : x.x[1];
  b[0] = odd ? x.x[2] : r0;
  b[1] = odd ? x.x[3] : r1;
}

// The same for one block (I, J) alone (a tile with an odd count of 16-column blocks): both
// lanes of the pair draw it and keep their own half, no shuffle.
template <bool kCells>
__device__ __forceinline__ void dropout_words_s1(const DropoutRng& r, int I, int J, int lane,
                                                 uint32_t (&a)[2]) {
  const int g = lane >> 2, t = lane & 3;
  if constexpr (kCells) {  // block A's two words only
    const DropoutWords4 x = dropout_words_cells(r, 0, 2, lane, I, J, I, J + 1);
    a[0] = x.w[0], a[1] = x.w[1];
    return;
  }
  I += r.qo >> 4, J += r.ko >> 4;
  const Philox4 x = dropout_bits(r.seed, r.offset, r.b, r.h, I, J, (g >> 1) * 4 + t);
  a[0] = (g & 1) ? x.x[2] : x.x[0];
  a[1] = (g & 1) ? x.x[3] : x.x[1];
}

// S^T orientation (backward; rows = keys): lane (k = lane / 4, q = lane % 4) holds key columns
// {k, k + 8} and query rows {2q, 2q + 1, 2q + 8, 2q + 9} of a block, unit (q, k / 2). Blocks
// A = (I, J) and B = (I2, J2) (query block I, key block J). On return a[e & 1] / b[e & 1]: the
// keep bytes of A / B, byte ch * 2 + (e >> 1) for query row ch * 8 + 2q + (e & 1) and key
// column k + 8 (e >> 1) (e the accumulator element of an m16n8 tile over 16 keys x 8
// queries, ch the half of the 16 query rows).
template <bool kCells>
__device__ __forceinline__ void dropout_words_st(const DropoutRng& r, int I, int J, int I2,
                                                 int J2, int lane, uint32_t (&a)[2],
                                                 uint32_t (&b)[2]) {
  const int k = lane >> 2, q = lane & 3;
  if constexpr (kCells) {
    const DropoutWords4 x = dropout_words_cells(r, 1, 4, lane, I, J, I2, J2);
    a[0] = x.w[0], a[1] = x.w[1], b[0] = x.w[2], b[1] = x.w[3];
    return;
  }
  I += r.qo >> 4, J += r.ko >> 4, I2 += r.qo >> 4, J2 += r.ko >> 4;
  const bool odd = k & 1;
  const Philox4 x = dropout_bits(r.seed, r.offset, r.b, r.h, odd ? I2 : I, odd ? J2 : J,
                                 q * 4 + (k >> 1));
  // Word w = ((row & 1) << 1) | (row >> 3) holds key column k at byte (k & 1) and k + 8 at
  // byte 2 + (k & 1): this lane keeps bytes {k & 1, 2 + (k & 1)} of every word, packed two
  // words to one (words 0, 1 -> a[0]; 2, 3 -> a[1]), and sends the other two.
  const uint32_t keep = odd ? 0x7531u : 0x6420u, send = odd ? 0x6420u : 0x7531u;
  const uint32_t k0 = __byte_perm(x.x[0], x.x[1], keep), k1 = __byte_perm(x.x[2], x.x[3], keep);
  const uint32_t s0 = __byte_perm(x.x[0], x.x[1], send), s1 = __byte_perm(x.x[2], x.x[3], send);
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, s0, 4);
  const uint32_t r1 = __shfl_xor_sync(0xffffffffu, s1, 4);
  a[0] = odd ? r0 : k0;
  a[1] = odd ? r1 : k1;
  b[0] = odd ? k0 : r0;
  b[1] = odd ? k1 : r1;
}

}  // namespace flashattn
