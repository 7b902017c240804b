// The CUDA kernels' entry points as a table of function pointers, for the split build
// (setup.py, FLASHATTN_SPLIT_CUDA=1): the extension flashattn._C (the API layer and the CPU
// backend, linked against torch's CPU libraries only) reaches the sm80 / sm90 families through
// this table, which a second extension, flashattn._C_cuda (the kernels, csrc/cuda_table/),
// hands it when torch has CUDA (flashattn/__init__.py). So the same wheel imports on a CPU-only
// torch. Torch-free and CUDA-free: both libraries include it. The members are the functions of
// sm80_backend.h / sm90_backend.h under the same names (null where that build leaves the
// family out) and the current CUDA stream.
#pragma once
#include <cstdint>

#include "../sm80/sm80_backend.h"
#include "../sm90/sm90_backend.h"

namespace flashattn {

// Bumped whenever a member is added, removed or changes type: the two libraries of one build
// always agree, and _C refuses a table of another version (a stale _C_cuda beside a new _C).
inline constexpr uint32_t kCudaTableVersion = 2;  // 2: sm90_fwd_workspace

struct CudaTable {
  uint32_t version, size;  // kCudaTableVersion, sizeof(CudaTable)
  // sm80 family
  decltype(&sm80::device_fit) sm80_device_fit;
  decltype(&sm80::built_targets) sm80_built_targets;
  decltype(&sm80::run_fwd) sm80_run_fwd;
  decltype(&sm80::run_kvcache_append) sm80_run_kvcache_append;
  decltype(&sm80::fwd_kvcache_workspace) sm80_fwd_kvcache_workspace;
  decltype(&sm80::run_fwd_kvcache) sm80_run_fwd_kvcache;
  decltype(&sm80::run_attn_probs) sm80_run_attn_probs;
  decltype(&sm80::bwd_workspace) sm80_bwd_workspace;
  decltype(&sm80::run_bwd) sm80_run_bwd;
  // sm90 family
  decltype(&sm90::fwd_unsupported_here) sm90_fwd_unsupported_here;
  decltype(&sm90::fwd_workspace) sm90_fwd_workspace;
  decltype(&sm90::run_fwd) sm90_run_fwd;
  decltype(&sm90::bwd_unsupported_here) sm90_bwd_unsupported_here;
  decltype(&sm90::bwd_workspace) sm90_bwd_workspace;
  decltype(&sm90::run_bwd) sm90_run_bwd;
  // The current CUDA stream of a device (torch's C shim, in libtorch_cuda): 0 on success.
  int32_t (*current_stream)(int32_t device_index, void** stream);
};

}  // namespace flashattn
