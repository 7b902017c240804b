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
  int64_t k_row0 = 0;  // first key row in k / v (paged: the first logical row)
  int32_t seqlen_q = 0, seqlen_k = 0;
  int32_t k_batch = 0;  // the k / v batch to address (padded; kv_batch_idx or b)
};

// An FP8 descale of (sequence b, KV head hk) (params.h): 1 without one.
FLASHATTN_HOST_DEVICE float descale_of(const float* ptr, int64_t batch_stride, int b, int hk) {
  return ptr != nullptr ? ptr[b * batch_stride + hk] : 1.f;
}

FLASHATTN_HOST_DEVICE int64_t clamp_i64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Padded: rows [0, seqlen) of batch b (address with the batch strides).
// Varlen: rows [cu[b], cu[b+1]) clamped to [0, total]; the batch strides are 0.
// KV cache / paged (params.h): the key range [leftpad, seqused + seqlen_knew) inside that.
FLASHATTN_HOST_DEVICE SeqInfo seq_info(const FwdParams& p, int b) {
  SeqInfo s;
  s.k_batch = b;
  int64_t k_end;  // the sequence's key rows are [k_row0, k_end)
  if (!p.is_varlen) {
    s.seqlen_q = p.seqlen_q;
    k_end = p.seqlen_k;
    if (p.kv_batch_idx != nullptr)
      s.k_batch = static_cast<int32_t>(clamp_i64(p.kv_batch_idx[b], 0, p.kv_batch - 1));
  } else {
    const int64_t q0 = clamp_i64(p.cu_seqlens_q[b], 0, p.total_q);
    const int64_t q1 = clamp_i64(p.cu_seqlens_q[b + 1], q0, p.total_q);
    s.q_row0 = q0;
    s.seqlen_q = static_cast<int32_t>(q1 - q0);
    if (p.block_table != nullptr) {  // logical rows [0, length) through the block table
      const int64_t len = static_cast<int64_t>(p.cu_seqlens_k[b + 1]) - p.cu_seqlens_k[b];
      k_end = clamp_i64(len, 0, p.seqlen_k);
    } else {
      const int64_t k0 = clamp_i64(p.cu_seqlens_k[b], 0, p.total_k);
      s.k_row0 = k0;
      k_end = clamp_i64(p.cu_seqlens_k[b + 1], k0, p.total_k);
    }
  }
  if (p.seqused_k != nullptr)
    k_end = clamp_i64(s.k_row0 + static_cast<int64_t>(p.seqused_k[b]) + p.seqlen_knew,
                      s.k_row0, k_end);
  if (p.leftpad_k != nullptr) s.k_row0 = clamp_i64(s.k_row0 + p.leftpad_k[b], s.k_row0, k_end);
  s.seqlen_k = static_cast<int32_t>(k_end - s.k_row0);
  return s;
}

// Block-sparse varlen (params.h): the mask covers each sequence's first n_blocks * block rows
// (at least max_seqlen); a sequence longer than that (wrong metadata) keeps nothing past it.
// The CUDA grids span these extents rather than max_seqlen. Otherwise seqlen, unchanged.
FLASHATTN_HOST_DEVICE int32_t mask_extent(int32_t seqlen, int32_t n_blocks, int32_t block,
                                          bool sparse_varlen) {
  const int64_t e = int64_t(n_blocks) * block;
  if (!sparse_varlen || e <= seqlen) return seqlen;
  return e > int64_t(0x7fffffff) ? 0x7fffffff : static_cast<int32_t>(e);
}
// The query rows / keys of that extent; sparse: the direction's block mask is given.
FLASHATTN_HOST_DEVICE int32_t mask_rows_q(const FwdParams& p, bool sparse) {
  return mask_extent(p.seqlen_q, p.n_qblocks, p.block_m, sparse && p.is_varlen);
}
FLASHATTN_HOST_DEVICE int32_t mask_rows_k(const FwdParams& p, bool sparse) {
  return mask_extent(p.seqlen_k, p.n_kblocks, p.block_n, sparse && p.is_varlen);
}

// Paged KV: the page holding logical key row r of sequence b (clamped into the pool).
FLASHATTN_HOST_DEVICE int64_t page_of(const FwdParams& p, int b, int64_t r) {
  const int64_t slot = clamp_i64(r / p.page_size, 0, p.max_pages_per_seq - 1);
  return clamp_i64(p.block_table[b * p.block_table_batch_stride + slot], 0, p.num_pages - 1);
}

}  // namespace flashattn
