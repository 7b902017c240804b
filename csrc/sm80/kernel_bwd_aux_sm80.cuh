// The sm80 backward's small kernels: the preprocessing (D = rowsum(dO * O)) and the
// conversions of the fp32 accumulators (dQ, and dK / dV for GQA) to the output dtype.
// Also the argument block every backward kernel gets as its __grid_constant__ parameter.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include "../common/mask.h"
#include "../common/params.h"
#include "../common/seqlen.h"
#include "primitives_bwd_sm80.cuh"

namespace flashattn::sm80 {

// Derived on the host from BwdParams (launch_bwd_sm80.cuh). Workspace layouts (fp32):
//   dq_accum [total_q][nheads][kHeadDim]; dk_accum / dv_accum [total_k][nheads_k][kHeadDim]
//   (GQA only). int32: dq_sem [batch][nheads][m_blocks], dkv_sem [batch][nheads_k][n_blocks]
//   (deterministic mode only). Row g of a padded tensor is b * seqlen + i.
struct BwdArgs {
  BwdParams p;
  float* dq_accum;
  float* dk_accum;  // nullptr unless group > 1
  float* dv_accum;
  int* dq_sem;      // nullptr unless deterministic
  int* dkv_sem;     // nullptr unless deterministic and group > 1
  int group;        // nheads / nheads_k
  int m_blocks;     // dq_sem stride per (batch, head): the layout's count (>= the tile's)
  int n_blocks;     // the tile's key blocks (the grid's x; dkv_sem stride)
  bool aligned_in;  // q/k/v/dO: 16-byte aligned pointers and strides (cp.async path)
  bool aligned_o;   // out: the same, for the preprocessing's vector loads
  bool pair_out;    // dq/dk/dv: 4-byte stores of element pairs are aligned
  bool rotate;      // no window: CTA n visits query blocks starting at n (see the kernel)
  int rot_chunk;    // rotate: the largest rotation chunk (bwd_order::rotation_chunk)
  bool heavy_first; // causal, non-deterministic: key block index the slowest in launch order
  const int* order; // sm90 block-sparse: the CTAs' launch order (sm90/bwd_order_sm90.cuh) or null
  bool det_diag;    // sm90 deterministic: the diagonal dQ order (sm90/bwd_layout_sm90.h)
  int det_dq_warps; // sm90 deterministic: dQ warps, 1 or 2 (sm90/kernel_bwd_sm90.cuh)
};

namespace bwd_detail {

// Sequence extents clamped to the max lengths the grid (and the semaphore arrays) were
// sized by: wrong varlen metadata gives wrong numbers, never an out-of-range index.
// Block-sparse varlen: to the mask's extents (seqlen.h), past which nothing is kept.
__device__ __forceinline__ SeqInfo seq_info_clamped(const BwdParams& p, int b) {
  SeqInfo s = seq_info(p, b);
  const bool sparse = p.q_num_blocks != nullptr;
  const int32_t max_q = mask_rows_q(p, sparse), max_k = mask_rows_k(p, sparse);
  s.seqlen_q = s.seqlen_q < max_q ? s.seqlen_q : max_q;
  s.seqlen_k = s.seqlen_k < max_k ? s.seqlen_k : max_k;
  return s;
}
// First row of sequence b in the (total, heads, dim) accumulators.
__device__ __forceinline__ int64_t q_row_global(const BwdParams& p, int b, const SeqInfo& s) {
  return (p.is_varlen ? 0 : int64_t(b) * p.seqlen_q) + s.q_row0;
}
__device__ __forceinline__ int64_t k_row_global(const BwdParams& p, int b, const SeqInfo& s) {
  return (p.is_varlen ? 0 : int64_t(b) * p.seqlen_k) + s.k_row0;
}

// 8 elements [col, col + 8) of a row as fp32, zero past `ncols`: one 16-byte load when
// `aligned` (pointer and strides 16-byte aligned, whole chunk inside), else scalar loads.
template <typename Element>
__device__ __forceinline__ void load8(float (&v)[8], const Element* row, int col, int ncols,
                                      bool aligned) {
  if (aligned && col + 8 <= ncols) {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + col);
    const Element* e = reinterpret_cast<const Element*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = to_float(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = col + i < ncols ? to_float(row[col + i]) : 0.f;
  }
}

// D[i] = sum_c dO[i, c] * O[i, c] over the value head dim, fp32, laid out like the LSE.
// 8 threads per row, each over 16-byte chunks; grid (ceil(seqlen_q / 32), nheads, batch).
template <int kHeadDim, typename Element>
__global__ void __launch_bounds__(256) bwd_preprocess_kernel(const __grid_constant__ BwdArgs args) {
  const BwdParams& p = args.p;
  const int b = blockIdx.z, h = blockIdx.y;
  const SeqInfo s = seq_info_clamped(p, b);
  const int i = blockIdx.x * 32 + threadIdx.x / 8;
  const int lane8 = threadIdx.x % 8;
  float acc = 0.f;
  if (i < s.seqlen_q) {
    const Element* o = static_cast<const Element*>(p.o_ptr) + b * p.o_batch_stride +
                       (s.q_row0 + i) * p.o_row_stride + h * p.o_head_stride;
    const Element* dout = static_cast<const Element*>(p.do_ptr) + b * p.do_batch_stride +
                          (s.q_row0 + i) * p.do_row_stride + h * p.do_head_stride;
#pragma unroll
    for (int c = lane8 * 8; c < kHeadDim; c += 64) {
      if (c < p.headdim_v) {
        float vo[8], vd[8];
        load8(vo, o, c, p.headdim_v, args.aligned_o);
        load8(vd, dout, c, p.headdim_v, args.aligned_in);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc += vo[e] * vd[e];
      }
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (i < s.seqlen_q && lane8 == 0) {
    p.dsoftmax_sum[b * p.lse_batch_stride + h * p.lse_head_stride + s.q_row0 + i] = acc;
  }
}

// dsink_h = -sum over every sequence's rows i of exp(sink_h - lse_i) * D_i (params.h), after
// the preprocessing wrote D. One CTA of kDsinkThreads per head; each thread sums a fixed set
// of rows (unrolled: the loads of 4 rows in flight, not one), then a fixed tree: the same bits
// on every run. Rows with lse = sink = -inf add nothing. (With 256 threads and one row in
// flight it took ~6% of a d128 causal N 2048 backward on the H200.)
constexpr int kDsinkThreads = 1024;
// A template (per Element) so that each translation unit's copy is a weak definition.
template <typename Element>
__global__ void __launch_bounds__(kDsinkThreads)
    bwd_dsink_kernel(const __grid_constant__ BwdParams p) {
  const int h = blockIdx.x;
  const float sink = p.sink_ptr[h];
  float acc = 0.f;
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo s = seq_info_clamped(p, b);
    const int64_t base = b * p.lse_batch_stride + h * p.lse_head_stride + s.q_row0;
#pragma unroll 4
    for (int i = threadIdx.x; i < s.seqlen_q; i += kDsinkThreads) {
      const float l = p.lse_ptr[base + i], d = p.dsoftmax_sum[base + i];
      acc -= l != -INFINITY ? expf(sink - l) * d : 0.f;
    }
  }
  __shared__ float part[kDsinkThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = part[threadIdx.x];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (threadIdx.x == 0) p.dsink_ptr[h] += t;
  }
}

// Writes 8 fp32 values (times `scale`) as elements [col, col + 8) of an output row, the
// columns past `ncols` left out.
template <typename Element>
__device__ __forceinline__ void store8(Element* row, int col, int ncols, const float (&v)[8],
                                       bool aligned) {
  if (aligned && col + 8 <= ncols) {
    uint4 raw;
    Element* e = reinterpret_cast<Element*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = from_float<Element>(v[i]);
    *reinterpret_cast<uint4*>(row + col) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (col + i < ncols) row[col + i] = from_float<Element>(v[i]);
  }
}

// fp32 accumulator [rows][heads][kHeadDim] (* scale) -> output tensor in Element, rows >=
// first_row (or >= *cu_end clamped, when given). With `accum` == nullptr writes zeros: the
// rows of a varlen dK / dV past the last sequence, which no main-kernel CTA owns.
// One thread per 8-column chunk.
template <int kHeadDim, typename Element>
__global__ void __launch_bounds__(256) bwd_convert_kernel(
    const float* __restrict__ accum, Element* out, int64_t rows, int heads, int ncols,
    int64_t seqlen, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
    float scale, int64_t first_row, const int32_t* cu_end, bool aligned) {
  constexpr int kChunks = kHeadDim / 8;
  if (cu_end != nullptr) first_row = clamp_i64(*cu_end, 0, rows);
  const int64_t n = (rows - first_row) * heads * kChunks;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(idx % kChunks) * 8;
    const int64_t rh = idx / kChunks;
    const int h = static_cast<int>(rh % heads);
    const int64_t r = first_row + rh / heads;
    if (c >= ncols) continue;
    float v[8];
    if (accum != nullptr) {
      const float4* src = reinterpret_cast<const float4*>(accum + (r * heads + h) * kHeadDim + c);
      const float4 a = src[0], bq = src[1];
      v[0] = a.x * scale; v[1] = a.y * scale; v[2] = a.z * scale; v[3] = a.w * scale;
      v[4] = bq.x * scale; v[5] = bq.y * scale; v[6] = bq.z * scale; v[7] = bq.w * scale;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = 0.f;
    }
    // Padded: row r is (r / seqlen, r % seqlen); varlen (seqlen = 0): batch stride 0.
    const int64_t bi = seqlen > 0 ? r / seqlen : 0;
    const int64_t ri = seqlen > 0 ? r % seqlen : r;
    Element* dst = out + bi * batch_stride + ri * row_stride + h * head_stride;
    store8(dst, c, ncols, v, aligned);
  }
}

}  // namespace bwd_detail
}  // namespace flashattn::sm80
