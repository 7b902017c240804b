// flashattn::sm90::run_bwd / bwd_unsupported_here: dtype x head-dim bucket -> the explicit
// instantiations in csrc/instantiations/bwd_sm90_hdim*_*.cu (launch_bwd_sm90.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>

#include "../common/cuda_check.h"
#include "../common/params.h"
#include "../common/static_switch.h"
#include "../common/tile_policy.h"
#include "launch_bwd_sm90.cuh"
#include "sm90_backend.h"

namespace flashattn::sm90 {

static_assert(sizeof(kBwdHeadDims) / sizeof(int) == 3 && kBwdHeadDims[0] == 64 &&
                  kBwdHeadDims[1] == 128 && kBwdHeadDims[2] == 256,
              "the switch below lists every backward head dim");
#define FLASHATTN_SM90_BWD_EXTERN(D)                                                    \
  extern template void run_bwd_hdim<D, D, __half>(const BwdParams&, cudaStream_t);     \
  extern template void run_bwd_hdim<D, D, __nv_bfloat16>(const BwdParams&, cudaStream_t);
FLASHATTN_SM90_BWD_EXTERN(64)
FLASHATTN_SM90_BWD_EXTERN(128)
FLASHATTN_SM90_BWD_EXTERN(256)
#undef FLASHATTN_SM90_BWD_EXTERN

const char* bwd_unsupported_here(const BwdParams& p) {
  if (current_device_attribute(cudaDevAttrComputeCapabilityMajor) != 9 ||
      current_device_attribute(cudaDevAttrComputeCapabilityMinor) != 0)
    return "the device (sm90 kernels run on compute capability 9.0 only)";
  const int bucket = sm90_bwd_kernel_dim(p);
  if (bucket == 0)
    return "head dims outside the 64, 96, 128, 192 and 256 buckets (96 / 192: equal qk and v "
           "head dims, no dropout, not deterministic, not under FLASHATTN_SM90_BWD_PAD=0)";
  int64_t smem = BwdConfigD256::kSmem;  // the d 256 kernel takes no block mask
  if (bucket == 256) {
    if (const char* why = bwd_d256_unsupported(p)) return why;
  } else {
    if (const char* why = bwd_unsupported(p, bucket)) return why;
    smem = (bucket == 64 ? BwdConfigFor<64>::kSmem : BwdConfigFor<128>::kSmem) +
           bwd_sparse_smem_bytes(p, bwd_sparse_list_cap(p, bucket == 64 ? 128 : 64));
  }
  if (smem_optin_bytes() < smem)
    return "the shared memory per block (FLASHATTN_SMEM_LIMIT or the GPU's is below the "
           "kernel's)";
  if (!headdim_built(bucket))
    return "its head-dim bucket, left out of this build (FLASHATTN_HEADDIMS)";
  return nullptr;
}

WorkspaceSizes bwd_workspace(const BwdParams& p) {
  const sm80::BwdWorkspaceLayout w = sm80::bwd_workspace_layout(p, sm90_bwd_kernel_dim(p));
  // Past the sm80 layout's int32 entries: a block-sparse call's launch order.
  return WorkspaceSizes{w.f32_elems, w.i32_elems + bwd_order_entries(p)};
}

void run_bwd(const BwdParams& p, void* stream) {
  const WorkspaceSizes need = bwd_workspace(p);
  if (p.workspace_f32_elems < need.f32_elems ||
      (need.f32_elems > 0 && p.workspace_f32 == nullptr))
    throw std::runtime_error("flashattn sm90 bwd: workspace smaller than bwd_workspace()");
  auto s = static_cast<cudaStream_t>(stream);
  const int bucket = sm90_bwd_kernel_dim(p);
  FLASHATTN_FP16_SWITCH(p.dtype, "flashattn sm90 bwd", [&] {
    if constexpr (headdim_built(64)) {
      if (bucket == 64) return run_bwd_hdim<64, 64, Element>(p, s);
    }
    if constexpr (headdim_built(128)) {
      if (bucket == 128) return run_bwd_hdim<128, 128, Element>(p, s);
    }
    if constexpr (headdim_built(256)) {
      if (bucket == 256) return run_bwd_hdim<256, 256, Element>(p, s);
    }
    throw std::runtime_error("flashattn sm90 bwd: no kernel for this head-dim bucket");
  });
}

}  // namespace flashattn::sm90
