// Entry points of the CPU backend. Torch-free: the API layer passes its thread pool in.
#pragma once
#include <cstdint>
#include <functional>
#include "../common/params.h"

namespace flashattn::cpu {

// Runs fn(begin, end) over disjoint sub-ranges covering [0, n), possibly in parallel.
using ParallelFor =
    std::function<void(int64_t n, const std::function<void(int64_t, int64_t)>& fn)>;

void run_fwd(const FwdParams& params, const ParallelFor& parallel_for);
// flash_attn_with_kvcache's append + rotary step (params.h, KvAppendParams); run_fwd takes
// the kvcache / paged fields of FwdParams.
void run_kvcache_append(const FwdParams& params, const KvAppendParams& append,
                        const ParallelFor& parallel_for);
BwdWorkspaceSizes bwd_workspace(const BwdParams& params);
void run_bwd(const BwdParams& params, const ParallelFor& parallel_for);
// attn_probs: S of params.h (s_ptr, zeroed by the caller; lse_ptr the forward's).
void run_probs(const FwdParams& params, const ParallelFor& parallel_for);

}  // namespace flashattn::cpu
