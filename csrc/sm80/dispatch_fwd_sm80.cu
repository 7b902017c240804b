// flashattn::sm80::run_fwd: dtype x head-dim bucket -> the explicit instantiations in
// csrc/instantiations/fwd_sm80_hdim*_*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

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

void run_fwd(const FwdParams& params, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int bucket = headdim_bucket(params.headdim, params.headdim_v);
  FLASHATTN_FP16_SWITCH(params.dtype, "flashattn sm80 fwd", [&] {
    FLASHATTN_HEADDIM_SWITCH(bucket, "flashattn sm80 fwd",
                             [&] { run_fwd_hdim<kHeadDim, Element>(params, s); });
  });
}

}  // namespace flashattn::sm80
