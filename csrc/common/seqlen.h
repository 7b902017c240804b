// Per-sequence bookkeeping shared by all backends: where sequence b starts in the q/k
// tensors and how long it is, clamped so that wrong varlen metadata can give wrong
// numbers but never an out-of-bounds index (conventions, rule 7).
#pragma once
#include <cstdint>
#include "params.h"

#if defined(__CUDACC__)
#define FLASHATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHATTN_HOST_DEVICE inline
#endif

namespace flashattn {

struct SeqInfo {
  int64_t q_row0 = 0;  // first row of this sequence in q / out / lse (varlen) or 0 (padded)
  int64_t k_row0 = 0;  // first row in k / v
  int32_t seqlen_q = 0, seqlen_k = 0;
};

FLASHATTN_HOST_DEVICE int64_t clamp_i64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Padded: rows [0, seqlen) of batch b (address with the batch strides).
// Varlen: rows [cu[b], cu[b+1]) clamped to [0, total]; the batch strides are 0.
FLASHATTN_HOST_DEVICE SeqInfo seq_info(const FwdParams& p, int b) {
  SeqInfo s;
  if (!p.is_varlen) {
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
    return s;
  }
  const int64_t q0 = clamp_i64(p.cu_seqlens_q[b], 0, p.total_q);
  const int64_t q1 = clamp_i64(p.cu_seqlens_q[b + 1], q0, p.total_q);
  const int64_t k0 = clamp_i64(p.cu_seqlens_k[b], 0, p.total_k);
  const int64_t k1 = clamp_i64(p.cu_seqlens_k[b + 1], k0, p.total_k);
  s.q_row0 = q0;
  s.k_row0 = k0;
  s.seqlen_q = static_cast<int32_t>(q1 - q0);
  s.seqlen_k = static_cast<int32_t>(k1 - k0);
  return s;
}

}  // namespace flashattn
