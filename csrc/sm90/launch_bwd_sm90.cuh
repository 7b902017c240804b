// Host side of the Hopper backward's main kernel (kernel_bwd_sm90.cuh), work in progress:
// what it takes, its tensor maps, the launch. The preprocessing and conversions around it are
// the sm80 backward's (sm80/kernel_bwd_aux_sm80.cuh); tools/selftest/selftest_bwd_sm90.cu
// runs the three in order. Not yet called by the package.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/cuda_check.h"
#include "../common/tile_policy.h"
#include "kernel_bwd_sm90.cuh"
#include "launch_fwd_sm90.cuh"  // tensor_map, fwd_unsupported's TMA rules

namespace flashattn::sm90 {

// Why the sm90 backward's main kernel does not take this call (nullptr: it does).
inline const char* bwd_unsupported(const BwdParams& p, int kD) {
  if (const char* why = fwd_unsupported(p)) return why;
  // The fp32 accumulators' rows are the sm80 bucket long (bwd_workspace_layout).
  if (headdim_bucket(p.headdim, p.headdim_v) != kD)
    return "head dims outside the kernel's bucket (the accumulators' row length)";
  if (p.softcap != 0.f || p.alibi_slopes != nullptr || !(p.softmax_scale > 0.f))
    return "softcap, ALiBi or a scale <= 0 (not yet)";
  if (p.deterministic) return "deterministic (not yet)";
  if (!aligned_to(p.do_ptr, 16) ||
      !strides_ok(p.do_row_stride, p.do_head_stride, p.do_batch_stride, 8))
    return "dout not 16-byte aligned in base and strides (TMA)";
  if (!aligned_to(p.dk_ptr, 4) || !aligned_to(p.dv_ptr, 4) ||
      !strides_ok(p.dk_row_stride, p.dk_head_stride, p.dk_batch_stride, 2) ||
      !strides_ok(p.dv_row_stride, p.dv_head_stride, p.dv_batch_stride, 2))
    return "dk / dv not 4-byte aligned (element pairs are stored)";
  return nullptr;
}

// The main kernel on args prepared as the sm80 backward prepares them (dq_accum zeroed; for
// GQA dk_accum / dv_accum zeroed, else nullptr and dK / dV written directly).
template <class Cfg, typename Element>
void launch_bwd_main_sm90(const sm80::BwdArgs& args, cudaStream_t stream) {
  const BwdParams& p = args.p;
  if (const char* why = bwd_unsupported(p, Cfg::kD))
    throw std::runtime_error(std::string("flashattn sm90 bwd: unsupported call: ") + why);
  const int64_t rows_q = p.is_varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = p.is_varlen ? p.total_k : p.seqlen_k;
  if (p.seqlen_q <= 0 || p.seqlen_k <= 0 || rows_q <= 0 || rows_k <= 0) return;
  const int batch = p.is_varlen ? 0 : p.batch;
  const BwdMaps maps{
      tensor_map<Element>(p.q_ptr, p.headdim, rows_q, p.nheads, batch, p.q_row_stride,
                          p.q_head_stride, p.q_batch_stride, Cfg::kBM),
      tensor_map<Element>(p.k_ptr, p.headdim, rows_k, p.nheads_k, batch, p.k_row_stride,
                          p.k_head_stride, p.k_batch_stride, Cfg::kBN),
      tensor_map<Element>(p.v_ptr, p.headdim_v, rows_k, p.nheads_k, batch, p.v_row_stride,
                          p.v_head_stride, p.v_batch_stride, Cfg::kBN),
      tensor_map<Element>(p.do_ptr, p.headdim_v, rows_q, p.nheads, batch, p.do_row_stride,
                          p.do_head_stride, p.do_batch_stride, Cfg::kBM)};
  auto kernel = bwd_kernel_sm90<Cfg, Element>;
  FLASHATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmem));
  const dim3 grid(static_cast<unsigned>((p.seqlen_k + Cfg::kBN - 1) / Cfg::kBN), p.nheads,
                  p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(args, maps);
  FLASHATTN_LAUNCH_CHECK();
}

}  // namespace flashattn::sm90
