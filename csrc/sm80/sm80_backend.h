// Entry points of the portable CUDA backend (sm80+). Torch-free; `stream` is a
// cudaStream_t (the current stream of q's device, chosen by the API layer under a
// device guard). Every launch is followed by a launch check that throws std::runtime_error.
#pragma once
#include <string>

#include "../common/params.h"

namespace flashattn::sm80 {

// How this build's code runs on the current device: its own machine code, PTX compiled by the
// driver at load, not at all (no target fits), or not at all (compute capability < 8.0).
enum class DeviceFit { kNative, kPtx, kNone, kTooOld };
DeviceFit device_fit(int& compute_capability);  // 10 * major + minor of the current device
std::string built_targets();                    // e.g. "sm_80, sm_90, compute_90"

void run_fwd(const FwdParams& params, void* stream);
BwdWorkspaceSizes bwd_workspace(const BwdParams& params);
void run_bwd(const BwdParams& params, void* stream);

}  // namespace flashattn::sm80
