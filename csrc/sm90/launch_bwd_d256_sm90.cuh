// Host side of the Hopper backward's d 256 main kernel (kernel_bwd_d256_sm90.cuh; the package's
// 256 bucket, and tools/selftest/selftest_bwd_sm80.cu -DSELFTEST_SM90 -DSELFTEST_D256): what it
// takes, its tensor maps, the launch, on args the sm80 backward prepared for the 256 bucket
// (dq_accum zeroed; GQA's dk_accum / dv_accum zeroed). Included by launch_bwd_sm90.cuh after
// the helpers it uses (bwd_unsupported, bwd_tensor_maps, bwd_section_pairs); include that one.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernel_bwd_d256_sm90.cuh"

namespace flashattn::sm90 {

// The d 256 kernel's dropout variant: on (tests and memcheck passed on the H100, 2026-12-06;
// 0.98-1.01 of the plain backward there, against 0.44-0.59 through sm80);
// FLASHATTN_SM90_DROPOUT_BWD_D256=0 (read per call) sends d 256 dropout backwards to sm80.
inline bool sm90_dropout_bwd_d256_enabled() {
#ifdef FLASHATTN_DISABLE_DROPOUT
  return false;
#else
  return !env_is("FLASHATTN_SM90_DROPOUT_BWD_D256", '0');
#endif
}

// Why the d 256 kernel does not take this call (nullptr: it does): the 64 / 128 kernel's rules
// at the 256 bucket, no block mask, and dropout only where its variant is on.
inline const char* bwd_d256_unsupported(const BwdParams& p) {
  if (p.dropout_threshold > 0 && !sm90_dropout_bwd_d256_enabled())
    return "dropout at d 256 under FLASHATTN_SM90_DROPOUT_BWD_D256=0";
  if (p.q_num_blocks != nullptr) return "a block mask (not in the d 256 kernel yet)";
  return bwd_unsupported(p, BwdConfigD256::kD);
}

template <typename Element>
void launch_bwd_main_d256_sm90(const sm80::BwdArgs& args, cudaStream_t stream,
                               BwdOrder order = BwdOrder::kAuto) {
  using Cfg = BwdConfigD256;
  const BwdParams& p = args.p;
  if (const char* why = bwd_d256_unsupported(p))
    throw std::runtime_error(std::string("flashattn sm90 bwd d256: unsupported call: ") + why);
  const int64_t rows_q = p.is_varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = p.is_varlen ? p.total_k : p.seqlen_k;
  if (p.seqlen_q <= 0 || p.seqlen_k <= 0 || rows_q <= 0 || rows_k <= 0) return;
  const BwdMaps maps = bwd_tensor_maps<Element>(args, Cfg::kD, Cfg::kBM, Cfg::kBN);
  const dim3 grid(static_cast<unsigned>((p.seqlen_k + Cfg::kBN - 1) / Cfg::kBN), p.nheads,
                  p.batch);
  if (int64_t(grid.x) * grid.y * grid.z > INT32_MAX)
    throw std::runtime_error("flashattn sm90 bwd d256: 2^31 CTAs or more");
  if (Cfg::kSmem > smem_optin_bytes())
    throw std::runtime_error("flashattn sm90 bwd d256: " + std::to_string(Cfg::kSmem) +
                             " bytes of shared memory, above the GPU's");
  auto kernel = bwd_score_mod_call(p) ? bwd_kernel_d256_sm90<Element, true>
                                      : bwd_kernel_d256_sm90<Element, false>;
#ifndef FLASHATTN_DISABLE_DROPOUT
  if (p.dropout_threshold > 0) kernel = bwd_kernel_d256_sm90<Element, false, true>;
#endif
  if (p.deterministic) kernel = bwd_kernel_d256_sm90<Element, false, false, true>;
#ifndef FLASHATTN_DISABLE_DROPOUT
  if (p.dropout_threshold > 0 && kernel != bwd_kernel_d256_sm90<Element, false, true>)
    throw std::runtime_error("flashattn sm90 bwd d256: a dropout call without the dropout kernel");
#endif
  sm80::BwdArgs a = args;
  a.det_diag = sm90_det_diag_call(p);
  a.det_dq_warps = sm90_det_dq_warps(p);
  auto launch = [&](decltype(kernel) k) {
    FLASHATTN_CUDA_CHECK(
        set_max_dynamic_smem(k, Cfg::kSmem));
    k<<<grid, Cfg::kThreads, static_cast<size_t>(Cfg::kSmem), stream>>>(
        a, maps, bwd_section_pairs(p, Cfg::kD, order));
    FLASHATTN_LAUNCH_CHECK();
  };
  launch(kernel);
#ifndef FLASHATTN_DISABLE_DROPOUT
  if (dropout_offsets_call(p))  // the cell-by-cell mask's kernel beside it (dropout_lanes.cuh)
    launch(bwd_kernel_d256_sm90<Element, false, true, false, true>);
#endif
}

}  // namespace flashattn::sm90
