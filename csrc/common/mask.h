// Visibility and ALiBi slopes, written once for every backend (the score semantics are in
// params.h). Backends use these per element or derive block ranges from them.
#pragma once
#include <cstdint>
#include "seqlen.h"

namespace flashattn {

struct MaskInfo {
  int32_t seqlen_q, seqlen_k;
  int32_t window_left, window_right;  // -1 = unbounded
  // Position offsets (params.h): q_pos_offset[b] - k_pos_offset[b], 0 without them. (CUDA
  // callers bound sequences and window sides below 2^28 with offsets, backend_choice.h, so
  // every sum below stays inside int32.)
  int32_t pos_shift = 0;
  // Diagonal offset of the bottom-right alignment: query i sits at key i + shift.
  FLASHATTN_HOST_DEVICE int32_t shift() const { return seqlen_k - seqlen_q + pos_shift; }

  FLASHATTN_HOST_DEVICE bool visible(int32_t i, int32_t j) const {
    if (j < 0 || j >= seqlen_k) return false;
    const int32_t c = i + shift();
    if (window_left >= 0 && j < c - window_left) return false;
    if (window_right >= 0 && j > c + window_right) return false;
    return true;
  }
  // Visible keys of query row i are [key_begin(i), key_end(i)) (possibly empty).
  FLASHATTN_HOST_DEVICE int32_t key_begin(int32_t i) const {
    const int32_t lo = window_left >= 0 ? i + shift() - window_left : 0;
    return lo < 0 ? 0 : (lo > seqlen_k ? seqlen_k : lo);
  }
  FLASHATTN_HOST_DEVICE int32_t key_end(int32_t i) const {
    const int32_t hi = window_right >= 0 ? i + shift() + window_right + 1 : seqlen_k;
    return hi < 0 ? 0 : (hi > seqlen_k ? seqlen_k : hi);
  }
  // Blocks of block_n keys holding every key visible to some row of [row_first, row_last]:
  // [lo, hi), lo == hi when none (a row's visible keys are one interval; both ends grow).
  struct BlockRange {
    int32_t lo, hi;
  };
  FLASHATTN_HOST_DEVICE BlockRange key_blocks(int32_t row_first, int32_t row_last,
                                              int32_t block_n) const {
    const int32_t kb = key_begin(row_first), ke = key_end(row_last);
    return ke > kb ? BlockRange{kb / block_n, (ke + block_n - 1) / block_n} : BlockRange{0, 0};
  }
  // Queries that see key j are [query_begin(j), query_end(j)) (the backward's key-block view).
  FLASHATTN_HOST_DEVICE int32_t query_begin(int32_t j) const {
    const int32_t lo = window_right >= 0 ? j - shift() - window_right : 0;
    return lo < 0 ? 0 : (lo > seqlen_q ? seqlen_q : lo);
  }
  FLASHATTN_HOST_DEVICE int32_t query_end(int32_t j) const {
    const int32_t hi = window_left >= 0 ? j - shift() + window_left + 1 : seqlen_q;
    return hi < 0 ? 0 : (hi > seqlen_q ? seqlen_q : hi);
  }
};

FLASHATTN_HOST_DEVICE MaskInfo mask_info(const FwdParams& p, const SeqInfo& s) {
  return MaskInfo{s.seqlen_q, s.seqlen_k, p.window_left, p.window_right};
}

#ifdef __CUDACC__
// Sequence b's position offsets on the device (the offsets live there), each clamped to [0,
// kMaxPosOffset] as params.h says, and its MaskInfo::pos_shift.
__device__ __forceinline__ int32_t q_pos_of(const FwdParams& p, int b) {
  return p.q_pos_offset ? min(max(p.q_pos_offset[b], 0), kMaxPosOffset) : 0;
}
__device__ __forceinline__ int32_t k_pos_of(const FwdParams& p, int b) {
  return p.k_pos_offset ? min(max(p.k_pos_offset[b], 0), kMaxPosOffset) : 0;
}
__device__ __forceinline__ int32_t pos_shift_of(const FwdParams& p, int b) {
  return q_pos_of(p, b) - k_pos_of(p, b);
}
#endif

// ALiBi slope of (b, h); 0 when off.
FLASHATTN_HOST_DEVICE float alibi_slope(const FwdParams& p, int b, int h) {
  return p.alibi_slopes ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;
}

}  // namespace flashattn
