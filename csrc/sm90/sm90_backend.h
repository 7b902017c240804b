// Entry points of the Hopper backend (sm_90a). Torch-free; `stream` is a cudaStream_t (the
// current stream of q's device, chosen by the API layer under a device guard). Every launch
// is followed by a launch check that throws std::runtime_error.
#pragma once
#include "../common/params.h"

namespace flashattn::sm90 {

// Why the sm90 forward does not take this call on the current device (nullptr: it does).
const char* fwd_unsupported_here(const FwdParams& params);
void run_fwd(const FwdParams& params, void* stream);

}  // namespace flashattn::sm90
