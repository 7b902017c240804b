// flashattn::sm90::run_fwd: dtype x head-dim variant -> the explicit instantiations in
// csrc/instantiations/fwd_sm90_hdim*_*.cu; fwd_unsupported_here: the call and the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/cuda_check.h"
#include "../common/params.h"
#include "../common/static_switch.h"
#include "../common/tile_policy.h"
#include "launch_fwd_sm90.cuh"
#include "sm90_backend.h"

namespace flashattn::sm90 {

static_assert(kNumFwdVariants == 5, "FLASHATTN_SM90_VARIANTS below lists every variant");
#define FLASHATTN_SM90_VARIANTS(X) X(0) X(1) X(2) X(3) X(4)
// The explicit instantiations of FN (run_fwd_hdim; run_fwd_fp8_hdim, out in Element) for
// variant I, in both 16-bit types.
#define FLASHATTN_SM90_EXTERN_OF(FN, I)                                                 \
  extern template void FN<kFwdHeadDimsQK[I], kFwdHeadDimsV[I], __half>(const FwdParams&,  \
                                                                      cudaStream_t);    \
  extern template void FN<kFwdHeadDimsQK[I], kFwdHeadDimsV[I], __nv_bfloat16>(          \
      const FwdParams&, cudaStream_t);
#define FLASHATTN_SM90_EXTERN(I) FLASHATTN_SM90_EXTERN_OF(run_fwd_hdim, I)
FLASHATTN_SM90_VARIANTS(FLASHATTN_SM90_EXTERN)
#undef FLASHATTN_SM90_EXTERN
#ifndef FLASHATTN_DISABLE_FP8
#define FLASHATTN_SM90_EXTERN(I) FLASHATTN_SM90_EXTERN_OF(run_fwd_fp8_hdim, I)
FLASHATTN_SM90_VARIANTS(FLASHATTN_SM90_EXTERN)
#undef FLASHATTN_SM90_EXTERN
#endif
#undef FLASHATTN_SM90_EXTERN_OF

// The head-dim bucket (FLASHATTN_HEADDIMS) a variant's instantiations belong to.
static constexpr int variant_bucket(int i) {
  return headdim_bucket(kFwdHeadDimsQK[i], kFwdHeadDimsV[i]);
}

const char* fwd_unsupported_here(const FwdParams& p) {
  // sm_90a machine code runs on compute capability 9.0 alone.
  if (current_device_attribute(cudaDevAttrComputeCapabilityMajor) != 9 ||
      current_device_attribute(cudaDevAttrComputeCapabilityMinor) != 0)
    return "the device (sm90 kernels run on compute capability 9.0 only)";
  if (const char* why = fwd_unsupported(p)) return why;
  const int v = fwd_variant_of_call(p);
  if (smem_optin_bytes() < fwd_smem_of_variant(v))
    return "the shared memory per block (FLASHATTN_SMEM_LIMIT or the GPU's is below the "
           "kernel's)";
  if (p.kv_num_blocks != nullptr) {
    const FwdTile t = fwd_sparse_tile_of_call(p);
    if (smem_optin_bytes() < fwd_smem_bytes(t, kFwdHeadDimsQK[v], kFwdHeadDimsV[v]) +
                                 fwd_sparse_smem_bytes(fwd_sparse_list_cap(p, t.block_n)))
      return "a block mask with more key tiles than the shared memory's tile lists hold (the "
             "sm80 kernels run it)";
  }
  if (!headdim_built(variant_bucket(v)))
    return "its head-dim bucket, left out of this build (FLASHATTN_HEADDIMS)";
  return nullptr;
}

WorkspaceSizes fwd_workspace(const FwdParams& p) { return fwd_workspace_of(p); }

// FP8 calls (issue 14) take run_fwd_fp8_hdim of their out dtype (under FLASHATTN_DISABLE_FP8
// a stub that raises; the API refuses FP8 there first).
void run_fwd(const FwdParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const bool fp8 = p.dtype == DType::kFloat8E4M3;
  switch (fwd_variant_of_call(p)) {
#define FLASHATTN_SM90_CASE(I)                                                            \
  case I:                                                                                 \
    if constexpr (headdim_built(variant_bucket(I))) {                                     \
      FLASHATTN_FP16_SWITCH(fp8 ? p.out_dtype : p.dtype, "flashattn sm90 fwd", [&] {      \
        if (fp8) run_fwd_fp8_hdim<kFwdHeadDimsQK[I], kFwdHeadDimsV[I], Element>(p, s);    \
        else run_fwd_hdim<kFwdHeadDimsQK[I], kFwdHeadDimsV[I], Element>(p, s);            \
      });                                                                                 \
      return;                                                                             \
    }                                                                                     \
    break;
    FLASHATTN_SM90_VARIANTS(FLASHATTN_SM90_CASE)
#undef FLASHATTN_SM90_CASE
    default:
      break;
  }
  throw std::runtime_error(std::string("flashattn sm90 fwd: ") + (fp8 ? "FP8 " : "") +
                           "head dims " + std::to_string(p.headdim) + "/" +
                           std::to_string(p.headdim_v) + " have no kernel in this build");
}

}  // namespace flashattn::sm90
