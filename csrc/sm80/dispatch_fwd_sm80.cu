// flashattn::sm80::run_fwd: dtype x head-dim bucket -> the explicit instantiations in
// csrc/instantiations/fwd_sm80_hdim*_*.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/params.h"
#include "../common/tile_policy.h"
#include "sm80_backend.h"

namespace flashattn::sm80 {

template <int kHeadDim, typename Element>
void run_fwd_hdim(const FwdParams&, cudaStream_t);

#define FLASHATTN_FWD_EXTERN(D)                                          \
  extern template void run_fwd_hdim<D, __half>(const FwdParams&, cudaStream_t); \
  extern template void run_fwd_hdim<D, __nv_bfloat16>(const FwdParams&, cudaStream_t);
FLASHATTN_FWD_EXTERN(32)
FLASHATTN_FWD_EXTERN(64)
FLASHATTN_FWD_EXTERN(96)
FLASHATTN_FWD_EXTERN(128)
FLASHATTN_FWD_EXTERN(192)
FLASHATTN_FWD_EXTERN(256)
#undef FLASHATTN_FWD_EXTERN

namespace {
template <typename Element>
void run_fwd_dtype(const FwdParams& p, cudaStream_t s) {
  switch (headdim_bucket(p.headdim, p.headdim_v)) {
    case 32: return run_fwd_hdim<32, Element>(p, s);
    case 64: return run_fwd_hdim<64, Element>(p, s);
    case 96: return run_fwd_hdim<96, Element>(p, s);
    case 128: return run_fwd_hdim<128, Element>(p, s);
    case 192: return run_fwd_hdim<192, Element>(p, s);
    case 256: return run_fwd_hdim<256, Element>(p, s);
    default:
      throw std::runtime_error("flashattn sm80 fwd: no kernel for head dims (" +
                               std::to_string(p.headdim) + ", " + std::to_string(p.headdim_v) +
                               ")");
  }
}
}  // namespace

void run_fwd(const FwdParams& params, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (params.dtype) {
    case DType::kFloat16: return run_fwd_dtype<__half>(params, s);
    case DType::kBFloat16: return run_fwd_dtype<__nv_bfloat16>(params, s);
    default: throw std::runtime_error("flashattn sm80 fwd: dtype must be float16 or bfloat16");
  }
}

}  // namespace flashattn::sm80
