// flashattn::sm80::run_fwd_kvcache / fwd_kvcache_workspace: dtype x head-dim bucket -> the
// split-KV decode kernels instantiated in csrc/instantiations/decode_sm80_hdim*_*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../common/params.h"
#include "../common/static_switch.h"
#include "../common/tile_policy.h"
#include "launch_decode_sm80.cuh"
#include "sm80_backend.h"

namespace flashattn::sm80 {

#define FLASHATTN_DECODE_EXTERN(D)                                                   \
  extern template void run_decode_hdim<D, __half>(const FwdParams&, cudaStream_t); \
  extern template void run_decode_hdim<D, __nv_bfloat16>(const FwdParams&, cudaStream_t);
FLASHATTN_FOR_EACH_HEADDIM(FLASHATTN_DECODE_EXTERN)
#undef FLASHATTN_DECODE_EXTERN

WorkspaceSizes fwd_kvcache_workspace(const FwdParams& params) {
  WorkspaceSizes ws;
  ws.f32_elems = decode_plan(params, headdim_bucket(params.headdim, params.headdim_v)).workspace_f32;
  return ws;
}

void run_fwd_kvcache(const FwdParams& params, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int bucket = headdim_bucket(params.headdim, params.headdim_v);
  FLASHATTN_FP16_SWITCH(params.dtype, "flashattn sm80 decode", [&] {
    FLASHATTN_HEADDIM_SWITCH(bucket, "flashattn sm80 decode",
                             [&] { run_decode_hdim<kHeadDim, Element>(params, s); });
  });
}

}  // namespace flashattn::sm80
