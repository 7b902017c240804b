// flashattn::sm80::run_attn_probs: S of params.h (return_attn_probs=True) on CUDA: exp(s - m),
// m the row's max visible score, negated where dropout drops it (philox.h's dropout_keep, the
// kernels' mask cell by cell). A debugging output, as in flash-attn (and the CPU's
// attn_probs.h): O(seqlen^2) memory and a plain kernel, one CTA per (row, head, batch) with
// the row of q in shared memory, two passes over the keys (the max, then S).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "../common/cuda_check.h"
#include "../common/mask.h"
#include "../common/params.h"
#include "../common/philox.h"
#include "../common/score_mod.h"
#include "../common/seqlen.h"
#include "../common/static_switch.h"
#include "primitives_sm80.cuh"
#include "sm80_backend.h"

namespace flashattn::sm80 {
namespace {

constexpr int kThreads = 256;

// grid (s_rows, batch * nheads); S was zeroed by the API.
template <typename T>
__global__ void __launch_bounds__(kThreads) attn_probs_kernel(const __grid_constant__ FwdParams p) {
  const int b = blockIdx.y / p.nheads, h = blockIdx.y % p.nheads, i = blockIdx.x;
  const SeqInfo seq = seq_info(p, b);
  const int sq = min(seq.seqlen_q, p.s_rows), sk = min(seq.seqlen_k, p.s_cols);
  if (i >= sq) return;
  const int hk = h / (p.nheads / p.nheads_k), d = p.headdim;
  extern __shared__ float q_row[];
  __shared__ float part[kThreads / 32];
  const T* q = static_cast<const T*>(p.q_ptr) + b * p.q_batch_stride +
               (seq.q_row0 + i) * p.q_row_stride + h * p.q_head_stride;
  for (int c = threadIdx.x; c < d; c += kThreads) q_row[c] = to_float(q[c]);
  __syncthreads();
  const MaskInfo mask = mask_info(p, seq);
  const int j_lo = max(mask.key_begin(i), 0), j_hi = min(mask.key_end(i), sk);
  const bool has_cap = p.softcap > 0.f;
  const float inv_cap = has_cap ? 1.f / p.softcap : 0.f, slope = alibi_slope(p, b, h);
  const T* k0 = static_cast<const T*>(p.k_ptr) + b * p.k_batch_stride +
                seq.k_row0 * p.k_row_stride + hk * p.k_head_stride;
  auto score = [&](int j) {
    const T* k = k0 + int64_t(j) * p.k_row_stride;
    float dot = 0.f;
    for (int c = 0; c < d; ++c) dot += q_row[c] * to_float(k[c]);
    return score_mod(dot * p.softmax_scale, has_cap, p.softcap, inv_cap, slope,
                     i + mask.shift() - j);
  };
  float mx = -INFINITY;
  for (int j = j_lo + threadIdx.x; j < j_hi; j += kThreads) mx = fmaxf(mx, score(j));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) mx = fmaxf(mx, part[w]);
  if (mx == -INFINITY) return;  // no visible key: S stays 0
  T* s_row = static_cast<T*>(p.s_ptr) + b * p.s_batch_stride + h * p.s_head_stride +
             int64_t(i) * p.s_row_stride;
  const bool drop = p.dropout_threshold > 0;
  const uint64_t seed = drop ? static_cast<uint64_t>(p.rng_state[0]) : 0;
  const uint64_t offset = drop ? static_cast<uint64_t>(p.rng_state[1]) : 0;
  for (int j = j_lo + threadIdx.x; j < j_hi; j += kThreads) {
    float prob = expf(score(j) - mx);
    if (drop && !dropout_keep(seed, offset, b, h, i, j, p.dropout_threshold)) prob = -prob;
    s_row[j] = from_float<T>(prob);
  }
}

}  // namespace

void run_attn_probs(const FwdParams& p, void* stream) {
  if (p.batch <= 0 || p.nheads <= 0 || p.s_rows <= 0 || p.s_cols <= 0) return;
  if (int64_t(p.batch) * p.nheads > 65535)
    throw std::runtime_error("flashattn sm80 attn_probs: batch x heads above 65535 (one grid)");
  const dim3 grid(p.s_rows, p.batch * p.nheads);
  const size_t smem = size_t(p.headdim) * sizeof(float);
  auto s = static_cast<cudaStream_t>(stream);
  FLASHATTN_FP16_SWITCH(p.dtype, "flashattn sm80 attn_probs", [&] {
    attn_probs_kernel<Element><<<grid, kThreads, smem, s>>>(p);
    FLASHATTN_LAUNCH_CHECK();
  });
}

}  // namespace flashattn::sm80
