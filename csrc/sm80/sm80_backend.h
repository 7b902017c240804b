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

// flash_attn_with_kvcache and paged KV (params.h: seqused_k, leftpad_k, kv_batch_idx,
// block_table): the append + rotary step (csrc/sm80/kvcache_append_sm80.cu), then the
// split-KV attention (csrc/sm80/decode_sm80.cu) over any of those fields, with its partial
// outputs in the workspace that fwd_kvcache_workspace asks for (num_splits 0 = chosen here
// from the grid and the SM count). run_fwd_kvcache also takes plain padded / varlen calls.
void run_kvcache_append(const FwdParams& params, const KvAppendParams& append, void* stream);
WorkspaceSizes fwd_kvcache_workspace(const FwdParams& params);
void run_fwd_kvcache(const FwdParams& params, void* stream);
// S of params.h (return_attn_probs=True): p.s_ptr zeroed by the API, p.lse_ptr the forward's.
void run_attn_probs(const FwdParams& params, void* stream);
BwdWorkspaceSizes bwd_workspace(const BwdParams& params);
void run_bwd(const BwdParams& params, void* stream);

}  // namespace flashattn::sm80
