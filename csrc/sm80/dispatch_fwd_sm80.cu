// flashattn::sm80::run_fwd: dtype x head-dim bucket -> the explicit instantiations in
// csrc/instantiations/fwd_sm80_hdim*_*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/cuda_check.h"
#include "../common/params.h"
#include "../common/static_switch.h"
#include "../common/tile_policy.h"
#include "sm80_backend.h"

namespace flashattn::sm80 {

template <int kHeadDim, typename Element>
void run_fwd_hdim(const FwdParams&, cudaStream_t);

#define FLASHATTN_FWD_EXTERN(D)                                                   \
  extern template void run_fwd_hdim<D, __half>(const FwdParams&, cudaStream_t); \
  extern template void run_fwd_hdim<D, __nv_bfloat16>(const FwdParams&, cudaStream_t);
FLASHATTN_FOR_EACH_HEADDIM(FLASHATTN_FWD_EXTERN)
#undef FLASHATTN_FWD_EXTERN

// The targets setup.py compiled this family for (TORCH_CUDA_ARCH_LIST, written into a generated
// header); the defaults match setup.py's when built without it (the tools/ self-tests).
#if __has_include("build_targets.h")
#include "build_targets.h"
#else
#define FLASHATTN_SM80_SASS 80, 90
#define FLASHATTN_SM80_PTX 90
#endif
constexpr int kSass[] = {FLASHATTN_SM80_SASS};
constexpr int kPtx[] = {FLASHATTN_SM80_PTX};

DeviceFit device_fit(int& cc) {
  cc = 10 * current_device_attribute(cudaDevAttrComputeCapabilityMajor) +
       current_device_attribute(cudaDevAttrComputeCapabilityMinor);
  if (cc < 80) return DeviceFit::kTooOld;
  for (int a : kSass)  // sm_XY machine code runs on X.Y .. X.9
    if (a / 10 == cc / 10 && a <= cc) return DeviceFit::kNative;
  for (int a : kPtx)
    if (a <= cc) return DeviceFit::kPtx;
  return DeviceFit::kNone;
}

std::string built_targets() {
  std::string s;
  for (int a : kSass) s += (s.empty() ? "sm_" : ", sm_") + std::to_string(a);
  for (int a : kPtx) s += ", compute_" + std::to_string(a);
  return s;
}

void run_fwd(const FwdParams& params, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int bucket = headdim_bucket(params.headdim, params.headdim_v);
  FLASHATTN_FP16_SWITCH(params.dtype, "flashattn sm80 fwd", [&] {
    FLASHATTN_HEADDIM_SWITCH(bucket, "flashattn sm80 fwd",
                             [&] { run_fwd_hdim<kHeadDim, Element>(params, s); });
  });
}

}  // namespace flashattn::sm80
