// flashattn::sm80::run_attn_probs: S of params.h (return_attn_probs=True) on CUDA. A debugging
// output, as in flash-attn (and the CPU's attn_probs.h): O(seqlen^2) memory and a plain
// kernel, one thread per (row, key column), the row of q in shared memory. P is the backward's,
// recomputed from the forward's lse (so the sink and the lse agree with the forward), negated
// where dropout drops it (philox.h's dropout_keep, the kernels' mask cell by cell).
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
#include "sm80_backend.h"

namespace flashattn::sm80 {
namespace {

template <typename T>
__device__ __forceinline__ float to_f(T x);
template <>
__device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

constexpr int kThreads = 256;

// grid (ceil(s_cols / kThreads), s_rows, batch * nheads); S was zeroed by the API.
template <typename T>
__global__ void __launch_bounds__(kThreads) attn_probs_kernel(const __grid_constant__ FwdParams p) {
  const int b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads, i = blockIdx.y;
  const int j = blockIdx.x * kThreads + threadIdx.x;
  const SeqInfo seq = seq_info(p, b);
  const int sq = min(seq.seqlen_q, p.s_rows), sk = min(seq.seqlen_k, p.s_cols);
  if (i >= sq) return;
  const int hk = h / (p.nheads / p.nheads_k), d = p.headdim;
  extern __shared__ float q_row[];
  const T* q = static_cast<const T*>(p.q_ptr) + b * p.q_batch_stride +
               (seq.q_row0 + i) * p.q_row_stride + h * p.q_head_stride;
  for (int c = threadIdx.x; c < d; c += kThreads) q_row[c] = to_f(q[c]);
  __syncthreads();
  if (j >= sk) return;
  const MaskInfo mask = mask_info(p, seq);
  if (j < mask.key_begin(i) || j >= mask.key_end(i)) return;  // not visible: S = 0
  const T* k = static_cast<const T*>(p.k_ptr) + b * p.k_batch_stride +
               (seq.k_row0 + j) * p.k_row_stride + hk * p.k_head_stride;
  float dot = 0.f;
  for (int c = 0; c < d; ++c) dot += q_row[c] * to_f(k[c]);
  const bool has_cap = p.softcap > 0.f;
  const float x = score_mod(dot * p.softmax_scale, has_cap, p.softcap,
                            has_cap ? 1.f / p.softcap : 0.f, alibi_slope(p, b, h),
                            i + mask.shift() - j);
  const float lse = p.lse_ptr[b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0 + i];
  float prob = lse == -INFINITY ? 0.f : expf(x - lse);
  if (p.dropout_threshold > 0 &&
      !dropout_keep(static_cast<uint64_t>(p.rng_state[0]), static_cast<uint64_t>(p.rng_state[1]),
                    b, h, i, j, p.dropout_threshold))
    prob = -prob;
  T* s = static_cast<T*>(p.s_ptr) + b * p.s_batch_stride + h * p.s_head_stride +
         int64_t(i) * p.s_row_stride + j;
  *s = from_f<T>(prob);
}

}  // namespace

void run_attn_probs(const FwdParams& p, void* stream) {
  if (p.batch <= 0 || p.nheads <= 0 || p.s_rows <= 0 || p.s_cols <= 0) return;
  if (int64_t(p.batch) * p.nheads > 65535 || p.s_rows > 65535)
    throw std::runtime_error("flashattn sm80 attn_probs: more than 65535 rows, or batch x heads "
                             "too large for one grid");
  const dim3 grid((p.s_cols + kThreads - 1) / kThreads, p.s_rows, p.batch * p.nheads);
  const size_t smem = size_t(p.headdim) * sizeof(float);
  auto s = static_cast<cudaStream_t>(stream);
  FLASHATTN_FP16_SWITCH(p.dtype, "flashattn sm80 attn_probs", [&] {
    attn_probs_kernel<Element><<<grid, kThreads, smem, s>>>(p);
    FLASHATTN_LAUNCH_CHECK();
  });
}

}  // namespace flashattn::sm80
