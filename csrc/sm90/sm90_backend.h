// Entry points of the Hopper backend (sm_90a). Torch-free; `stream` is a cudaStream_t (the
// current stream of q's device, chosen by the API layer under a device guard). Every launch
// is followed by a launch check that throws std::runtime_error.
#pragma once
#include "../common/params.h"

namespace flashattn::sm90 {

// Why the sm90 forward does not take this call on the current device (nullptr: it does).
const char* fwd_unsupported_here(const FwdParams& params);
// The forward's workspace (FP8 calls: the staged inputs, stage_fp8_sm90.cuh; none otherwise),
// allocated by the API (zeroed for varlen calls) into workspace_f32.
WorkspaceSizes fwd_workspace(const FwdParams& params);
void run_fwd(const FwdParams& params, void* stream);

// The backward (buckets 64 and 128; the sm80 workspace of sm80::bwd_workspace): why it does
// not take this call on the current device (nullptr: it does), and the run.
const char* bwd_unsupported_here(const BwdParams& params);
WorkspaceSizes bwd_workspace(const BwdParams& params);
void run_bwd(const BwdParams& params, void* stream);

}  // namespace flashattn::sm90
