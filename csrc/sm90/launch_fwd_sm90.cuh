// Host side of the prototype Hopper forward (kernel_fwd_sm90.cuh): TMA tensor maps through
// the driver entry point (no libcuda to link against), the checks, the launch.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/cuda_check.h"
#include "kernel_fwd_sm90.cuh"

namespace flashattn::sm90 {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    FLASHATTN_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                          cudaEnableDefault, &q));
    if (f == nullptr || q != cudaDriverEntryPointSuccess)
      throw std::runtime_error("flashattn sm90: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A (batch, rows, heads, 128) bf16 tensor (strides in elements) as boxes of 64 columns x
// box_rows rows of one head, 128-byte swizzled. Rows past `rows` read as zeros.
inline CUtensorMap bshd_map(const void* ptr, int rows, int heads, int batch, int64_t row_stride,
                            int64_t head_stride, int64_t batch_stride, int box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[4] = {cuuint64_t(kFwdD), cuuint64_t(rows), cuuint64_t(heads),
                              cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(row_stride) * 2, cuuint64_t(head_stride) * 2,
                                 cuuint64_t(batch_stride) * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1}, estr[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(ptr), dims, strides, box, estr,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("flashattn sm90: cuTensorMapEncodeTiled failed (" +
                             std::to_string(int(r)) + ")");
  return m;
}

// What the prototype covers; the caller falls back to sm80 for anything else. Windows are
// as the API passes them (a side >= seqlen_k comes as -1).
inline bool fwd_sm90_supports(const FwdParams& p) {
  auto al16 = [](const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  auto ok_strides = [](int64_t a, int64_t b, int64_t c, int64_t m) {
    auto one = [m](int64_t x) { return x >= 0 && x < (int64_t(1) << 39) && x % m == 0; };
    return one(a) && one(b) && one(c);  // TMA: byte strides multiples of 16, below 2^40
  };
  return p.dtype == DType::kBFloat16 && p.headdim == kFwdD && p.headdim_v == kFwdD &&
         !p.is_varlen && p.softcap == 0.f && p.alibi_slopes == nullptr &&
         p.softmax_scale > 0.f && p.nheads_k >= 1 && p.nheads % p.nheads_k == 0 &&
         p.nheads <= 65535 && p.batch <= 65535 && p.seqlen_q >= 0 && p.seqlen_k >= 0 &&
         al16(p.q_ptr) && al16(p.k_ptr) && al16(p.v_ptr) &&
         ok_strides(p.q_row_stride, p.q_head_stride, p.q_batch_stride, 8) &&
         ok_strides(p.k_row_stride, p.k_head_stride, p.k_batch_stride, 8) &&
         ok_strides(p.v_row_stride, p.v_head_stride, p.v_batch_stride, 8) &&
         ok_strides(p.o_row_stride, p.o_head_stride, p.o_batch_stride, 2) &&
         reinterpret_cast<uintptr_t>(p.o_ptr) % 4 == 0 &&
         current_device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
         current_device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
}

// Defaults from the H200 (tools/selftest_fwd_sm90.cu, TFLOP/s, d128, N 16k non-causal /
// causal): serial 610 / 608, kOverlap 458 / 525, kOverlap + heavy_first 488 / 456.
template <bool kOverlap = false>
void run_fwd_sm90(const FwdParams& p, cudaStream_t stream, bool heavy_first = false) {
  if (!fwd_sm90_supports(p)) throw std::runtime_error("flashattn sm90 fwd: unsupported call");
  if (p.seqlen_q <= 0 || p.batch <= 0 || p.nheads <= 0) return;
  const CUtensorMap q_map = bshd_map(p.q_ptr, p.seqlen_q, p.nheads, p.batch, p.q_row_stride,
                                     p.q_head_stride, p.q_batch_stride, kFwdBM);
  // No keys: every row gets O = 0 and lse = -inf and nothing is loaded, but a tensor map
  // needs extents >= 1 and an address: q's stands in for the empty k and v.
  const FwdMaps maps =
      p.seqlen_k == 0
          ? FwdMaps{q_map, q_map, q_map}
          : FwdMaps{q_map,
                    bshd_map(p.k_ptr, p.seqlen_k, p.nheads_k, p.batch, p.k_row_stride,
                             p.k_head_stride, p.k_batch_stride, kFwdBN),
                    bshd_map(p.v_ptr, p.seqlen_k, p.nheads_k, p.batch, p.v_row_stride,
                             p.v_head_stride, p.v_batch_stride, kFwdBN)};
  const int64_t m_blocks = (p.seqlen_q + kFwdBM - 1) / kFwdBM;
  heavy_first = heavy_first &&
                heavy_first_ok(p.window_left, p.window_right, m_blocks * p.nheads * p.batch);
  auto kernel = fwd_kernel_sm90<kOverlap>;
  FLASHATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFwdSmem));
  const dim3 grid(static_cast<unsigned>(m_blocks), p.nheads, p.batch);
  kernel<<<grid, kFwdThreads, kFwdSmem, stream>>>(p, maps, heavy_first);
  FLASHATTN_LAUNCH_CHECK();
}

}  // namespace flashattn::sm90
