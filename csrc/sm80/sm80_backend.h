// Entry points of the portable CUDA backend (sm80+). Torch-free; `stream` is a
// cudaStream_t (the current stream of q's device, chosen by the API layer under a
// device guard). Every launch is followed by a launch check that throws std::runtime_error.
#pragma once
#include "../common/params.h"

namespace flashattn::sm80 {

void run_fwd(const FwdParams& params, void* stream);
BwdWorkspaceSizes bwd_workspace(const BwdParams& params);
void run_bwd(const BwdParams& params, void* stream);

}  // namespace flashattn::sm80
