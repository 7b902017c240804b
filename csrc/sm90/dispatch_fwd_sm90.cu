// flashattn::sm90::run_fwd: dtype x head dim -> the explicit instantiations in
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

static_assert(sizeof(kFwdHeadDims) == sizeof(int) && kFwdHeadDims[0] == 128 &&
                  headdim_bucket(128, 128) == 128,
              "run_fwd below must switch over every head dim of kFwdHeadDims (a bucket)");
extern template void run_fwd_hdim<128, __half>(const FwdParams&, cudaStream_t);
extern template void run_fwd_hdim<128, __nv_bfloat16>(const FwdParams&, cudaStream_t);

const char* fwd_unsupported_here(const FwdParams& p) {
  // sm_90a machine code runs on compute capability 9.0 alone.
  if (current_device_attribute(cudaDevAttrComputeCapabilityMajor) != 9 ||
      current_device_attribute(cudaDevAttrComputeCapabilityMinor) != 0)
    return "the device (sm90 kernels run on compute capability 9.0 only)";
  if (smem_optin_bytes() < kFwdSmem)
    return "the shared memory per block (FLASHATTN_SMEM_LIMIT or the GPU's is below the "
           "kernel's)";
  if (!headdim_built(128)) return "head dim 128, left out of this build (FLASHATTN_HEADDIMS)";
  return fwd_unsupported(p);
}

void run_fwd(const FwdParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if constexpr (headdim_built(128)) {
    FLASHATTN_FP16_SWITCH(p.dtype, "flashattn sm90 fwd",
                          [&] { run_fwd_hdim<128, Element>(p, s); });
  } else {
    throw std::runtime_error("flashattn sm90 fwd: head dim 128 was left out of this build");
  }
}

}  // namespace flashattn::sm90
