// flashattn::sm80::bwd_workspace / run_bwd: dtype x head-dim bucket -> the explicit
// instantiations in csrc/instantiations/bwd_sm80_hdim*_*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/params.h"
#include "../common/static_switch.h"
#include "../common/tile_policy.h"
#include "sm80_backend.h"
#include "tile_bwd_sm80.h"

namespace flashattn::sm80 {

template <int kHeadDim, typename Element>
void run_bwd_hdim(const BwdParams&, cudaStream_t);

#define FLASHATTN_BWD_EXTERN(D)                                                   \
  extern template void run_bwd_hdim<D, __half>(const BwdParams&, cudaStream_t); \
  extern template void run_bwd_hdim<D, __nv_bfloat16>(const BwdParams&, cudaStream_t);
FLASHATTN_FOR_EACH_HEADDIM(FLASHATTN_BWD_EXTERN)
#undef FLASHATTN_BWD_EXTERN

namespace {
int bucket_or_throw(const BwdParams& p) {
  const int bucket = headdim_bucket(p.headdim, p.headdim_v);
  if (bucket == 0 || p.headdim <= 0 || p.headdim_v <= 0)
    throw std::runtime_error("flashattn sm80 bwd: no kernel for head dims (" +
                             std::to_string(p.headdim) + ", " + std::to_string(p.headdim_v) +
                             ")");
  if (p.nheads_k <= 0 || p.nheads % p.nheads_k != 0)
    throw std::runtime_error("flashattn sm80 bwd: nheads must be a multiple of nheads_k");
  return bucket;
}

}  // namespace

BwdWorkspaceSizes bwd_workspace(const BwdParams& params) {
  const BwdWorkspaceLayout w = bwd_workspace_layout(params, bucket_or_throw(params));
  BwdWorkspaceSizes sizes;
  sizes.f32_elems = w.f32_elems;
  sizes.i32_elems = w.i32_elems;
  return sizes;
}

void run_bwd(const BwdParams& params, void* stream) {
  const int bucket = bucket_or_throw(params);
  const BwdWorkspaceLayout w = bwd_workspace_layout(params, bucket);
  if (params.workspace_f32_elems < w.f32_elems || params.workspace_i32_elems < w.i32_elems ||
      (w.f32_elems > 0 && params.workspace_f32 == nullptr) ||
      (w.i32_elems > 0 && params.workspace_i32 == nullptr))
    throw std::runtime_error("flashattn sm80 bwd: workspace smaller than bwd_workspace()");
  auto s = static_cast<cudaStream_t>(stream);
  FLASHATTN_FP16_SWITCH(params.dtype, "flashattn sm80 bwd", [&] {
    FLASHATTN_HEADDIM_SWITCH(bucket, "flashattn sm80 bwd",
                             [&] { run_bwd_hdim<kHeadDim, Element>(params, s); });
  });
}

}  // namespace flashattn::sm80
