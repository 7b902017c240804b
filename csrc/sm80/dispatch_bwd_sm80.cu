// flashattn::sm80::bwd_workspace / run_bwd: dtype x head-dim bucket -> the explicit
// instantiations in csrc/instantiations/bwd_sm80_hdim*_*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/params.h"
#include "../common/tile_policy.h"
#include "sm80_backend.h"
#include "tile_bwd_sm80.h"

namespace flashattn::sm80 {

template <int kHeadDim, typename Element>
void run_bwd_hdim(const BwdParams&, cudaStream_t);

#define FLASHATTN_BWD_EXTERN(D)                                                  \
  extern template void run_bwd_hdim<D, __half>(const BwdParams&, cudaStream_t); \
  extern template void run_bwd_hdim<D, __nv_bfloat16>(const BwdParams&, cudaStream_t);
FLASHATTN_BWD_EXTERN(32)
FLASHATTN_BWD_EXTERN(64)
FLASHATTN_BWD_EXTERN(96)
FLASHATTN_BWD_EXTERN(128)
FLASHATTN_BWD_EXTERN(192)
FLASHATTN_BWD_EXTERN(256)
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

template <typename Element>
void run_bwd_dtype(const BwdParams& p, cudaStream_t s) {
  switch (bucket_or_throw(p)) {
    case 32: return run_bwd_hdim<32, Element>(p, s);
    case 64: return run_bwd_hdim<64, Element>(p, s);
    case 96: return run_bwd_hdim<96, Element>(p, s);
    case 128: return run_bwd_hdim<128, Element>(p, s);
    case 192: return run_bwd_hdim<192, Element>(p, s);
    case 256: return run_bwd_hdim<256, Element>(p, s);
    default: throw std::runtime_error("flashattn sm80 bwd: unexpected head-dim bucket");
  }
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
  const BwdWorkspaceLayout w = bwd_workspace_layout(params, bucket_or_throw(params));
  if (params.workspace_f32_elems < w.f32_elems || params.workspace_i32_elems < w.i32_elems ||
      (w.f32_elems > 0 && params.workspace_f32 == nullptr) ||
      (w.i32_elems > 0 && params.workspace_i32 == nullptr))
    throw std::runtime_error("flashattn sm80 bwd: workspace smaller than bwd_workspace()");
  auto s = static_cast<cudaStream_t>(stream);
  switch (params.dtype) {
    case DType::kFloat16: return run_bwd_dtype<__half>(params, s);
    case DType::kBFloat16: return run_bwd_dtype<__nv_bfloat16>(params, s);
    default: throw std::runtime_error("flashattn sm80 bwd: dtype must be float16 or bfloat16");
  }
}

}  // namespace flashattn::sm80
