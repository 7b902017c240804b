// flash_attn_with_kvcache's append + rotary step on CUDA (sm80+), before the attention
// (params.h, KvAppendParams): one CTA per (row, head) vector, first the new keys / values of
// every (batch, new row, KV head) into the caches, then the rotated q rows. Element-wise in
// fp32, rounded once to the cache dtype. Every cache row index and page comes from the
// clamped metadata (seq_info's k_batch, page_of); a row past the capacity is dropped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "../common/cuda_check.h"
#include "../common/params.h"
#include "../common/seqlen.h"
#include "../common/static_switch.h"
#include "sm80_backend.h"

namespace flashattn::sm80 {
namespace {

template <typename Element>
__device__ __forceinline__ float to_f32(Element x) {
  if constexpr (std::is_same_v<Element, __half>) return __half2float(x);
  else return __bfloat162float(x);
}
template <typename Element>
__device__ __forceinline__ Element from_f32(float x) {
  if constexpr (std::is_same_v<Element, __half>) return __float2half_rn(x);
  else return __float2bfloat16_rn(x);
}

// dst[0, d) = src rotated at position pos (dims past rotary_dim copied), one thread per
// column pair / column, strided over the CTA.
template <typename Element>
__device__ void rotate_row(Element* dst, const Element* src, int d, int64_t pos,
                           const KvAppendParams& a) {
  const int rd = a.rotary_dim, half = rd / 2;
  const int64_t ro = pos < 0 ? 0 : (pos >= a.seqlen_ro ? a.seqlen_ro - 1 : pos);
  const Element* cs = static_cast<const Element*>(a.rotary_cos) + ro * a.rotary_stride;
  const Element* sn = static_cast<const Element*>(a.rotary_sin) + ro * a.rotary_stride;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    if (c >= rd) {
      dst[c] = src[c];
      continue;
    }
    // Column c pairs with its partner; j indexes cos / sin.
    const int j = a.rotary_interleaved ? c / 2 : c % half;
    const bool first = a.rotary_interleaved ? (c % 2 == 0) : (c < half);
    const int partner = a.rotary_interleaved ? (c ^ 1) : (first ? c + half : c - half);
    const float x = to_f32(src[c]), y = to_f32(src[partner]);
    const float co = to_f32(cs[j]), si = to_f32(sn[j]);
    dst[c] = from_f32<Element>(first ? x * co - y * si : y * si + x * co);
  }
}

template <typename Element>
__global__ void __launch_bounds__(128)
    kvcache_append_kernel(const __grid_constant__ FwdParams p,
                          const __grid_constant__ KvAppendParams a, int64_t k_items) {
  const int64_t item = blockIdx.x;
  const bool rotary = a.rotary_dim > 0;
  if (item < k_items) {  // new key / value row (b, i, hk)
    const int hk = static_cast<int>(item % p.nheads_k);
    const int64_t bi = item / p.nheads_k;
    const int i = static_cast<int>(bi % p.seqlen_knew), b = static_cast<int>(bi / p.seqlen_knew);
    const int64_t pos = (p.seqused_k ? int64_t(p.seqused_k[b]) : 0) + i;  // absolute cache row
    if (pos < 0 || pos >= p.seqlen_k) return;
    int64_t koff, voff;
    if (p.block_table != nullptr) {
      const int64_t pg = page_of(p, b, pos), r = pos % p.page_size;
      koff = pg * p.k_batch_stride + r * p.k_row_stride;
      voff = pg * p.v_batch_stride + r * p.v_row_stride;
    } else {
      const int64_t kb = seq_info(p, b).k_batch;
      koff = kb * p.k_batch_stride + pos * p.k_row_stride;
      voff = kb * p.v_batch_stride + pos * p.v_row_stride;
    }
    Element* kd = static_cast<Element*>(const_cast<void*>(p.k_ptr)) + koff + hk * p.k_head_stride;
    Element* vd = static_cast<Element*>(const_cast<void*>(p.v_ptr)) + voff + hk * p.v_head_stride;
    const Element* ks = static_cast<const Element*>(a.knew_ptr) + b * a.knew_batch_stride +
                        i * a.knew_row_stride + hk * a.knew_head_stride;
    const Element* vs = static_cast<const Element*>(a.vnew_ptr) + b * a.vnew_batch_stride +
                        i * a.vnew_row_stride + hk * a.vnew_head_stride;
    if (rotary) {
      rotate_row(kd, ks, p.headdim, pos, a);
    } else {
      for (int c = threadIdx.x; c < p.headdim; c += blockDim.x) kd[c] = ks[c];
    }
    for (int c = threadIdx.x; c < p.headdim_v; c += blockDim.x) vd[c] = vs[c];
    return;
  }
  // Rotated q row (b, t, h): its batch's first row is b (padded only).
  const int64_t qi = item - k_items;
  const int h = static_cast<int>(qi % p.nheads);
  const int64_t bt = qi / p.nheads;
  const int t = static_cast<int>(bt % p.seqlen_q), b = static_cast<int>(bt / p.seqlen_q);
  const int64_t pos = (p.seqused_k ? int64_t(p.seqused_k[b]) : 0) + (a.q_rot_per_row ? t : 0);
  const Element* qs = static_cast<const Element*>(p.q_ptr) + b * p.q_batch_stride +
                      t * p.q_row_stride + h * p.q_head_stride;
  Element* qd = static_cast<Element*>(a.q_rot_ptr) + b * a.q_rot_batch_stride +
                t * a.q_rot_row_stride + h * a.q_rot_head_stride;
  rotate_row(qd, qs, p.headdim, pos, a);
}

}  // namespace

// p: the attention's params over the caches, with q_ptr the caller's (unrotated) q.
void run_kvcache_append(const FwdParams& p, const KvAppendParams& a, void* stream) {
  if (p.is_varlen) throw std::runtime_error("flashattn kvcache append: padded q only");
  const bool append = a.knew_ptr != nullptr && a.vnew_ptr != nullptr;
  const int64_t k_items = append ? int64_t(p.batch) * p.seqlen_knew * p.nheads_k : 0;
  const int64_t q_items = a.rotary_dim > 0 ? int64_t(p.batch) * p.seqlen_q * p.nheads : 0;
  const int64_t items = k_items + q_items;
  if (items == 0) return;
  if (items > 0x7fffffff) throw std::runtime_error("flashattn kvcache append: too many rows");
  auto s = static_cast<cudaStream_t>(stream);
  FLASHATTN_FP16_SWITCH(p.dtype, "flashattn sm80 kvcache append", [&] {
    kvcache_append_kernel<Element><<<static_cast<unsigned>(items), 128, 0, s>>>(p, a, k_items);
    FLASHATTN_LAUNCH_CHECK();
  });
}

}  // namespace flashattn::sm80
