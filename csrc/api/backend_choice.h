// Which backend runs a call: decided here, once per direction, from the tensors' device, the
// build, what each backend says it takes, and FLASHATTN_FORCE_BACKEND. The ops run what this
// picks; torch.ops.flashattn.kernel_path (flashattn.kernel_path) reports it.
#pragma once
#include <cstdlib>
#include <string>

#include "../common/params.h"
#include "checks.h"

#if defined(FLASHATTN_DISABLE_CUDA) && !defined(FLASHATTN_DISABLE_SM80)
#define FLASHATTN_DISABLE_SM80
#endif
#if defined(FLASHATTN_DISABLE_CUDA) && !defined(FLASHATTN_DISABLE_SM90)
#define FLASHATTN_DISABLE_SM90
#endif
#ifndef FLASHATTN_DISABLE_SM80
#include "../sm80/sm80_backend.h"
#endif
#ifndef FLASHATTN_DISABLE_SM90
#include "../sm90/sm90_backend.h"
#endif

namespace flashattn::api {

// kSm80Ptx: the portable kernels, JIT-compiled by the driver from their PTX (a GPU newer than
// every machine-code target of the build, e.g. sm_100).
enum class Backend { kCpu, kSm80, kSm80Ptx, kSm90 };

inline const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kCpu: return "cpu";
    case Backend::kSm80: return "sm80";
    case Backend::kSm80Ptx: return "sm80-ptx";
    case Backend::kSm90: return "sm90";
  }
  return "?";
}

enum class Force { kAuto, kSm80, kSm90 };

// FLASHATTN_FORCE_BACKEND, read on every call (tests switch it): unset, "" or "auto" = the
// default choice; "sm80" / "sm90" = that backend or a named error. CUDA calls only.
inline Force forced_backend() {
  const char* env = std::getenv("FLASHATTN_FORCE_BACKEND");
  const std::string v = env ? env : "";
  if (v.empty() || v == "auto") return Force::kAuto;
  if (v == "sm80") return Force::kSm80;
  if (v == "sm90") return Force::kSm90;
  fail("FLASHATTN_FORCE_BACKEND must be sm80, sm90 or auto (or unset), got '", v, "'");
}

// The portable kernels on the current device, or a named error saying why they cannot run.
inline Backend sm80_or_fail(const char* what) {
#ifndef FLASHATTN_DISABLE_SM80
  int cc = 0;
  switch (sm80::device_fit(cc)) {
    case sm80::DeviceFit::kNative: return Backend::kSm80;
    case sm80::DeviceFit::kPtx: return Backend::kSm80Ptx;
    case sm80::DeviceFit::kTooOld:
      fail("the CUDA kernels need compute capability >= 8.0, this GPU has ", cc / 10, ".",
           cc % 10);
    case sm80::DeviceFit::kNone: break;
  }
  fail("this build's portable CUDA kernels (", sm80::built_targets(), ") do not run on "
       "compute capability ", cc / 10, ".", cc % 10, "; rebuild with TORCH_CUDA_ARCH_LIST "
       "including ", cc / 10, ".", cc % 10);
#else
  fail(what, " on CUDA tensors needs the portable (sm80) kernels, but this build has none "
       "(built with FLASHATTN_DISABLE_CUDA or FLASHATTN_DISABLE_SM80, or TORCH_CUDA_ARCH_LIST "
       "without an arch >= 8.0, or without a CUDA toolkit)");
#endif
}

// The forward's backend for a CUDA call whose params are filled (output pointers may be null
// when only asking); the caller holds a device guard for q's device. CPU calls run kCpu.
inline Backend choose_fwd(const FwdParams& p) {
  const Force force = forced_backend();
  if (force == Force::kSm80) return sm80_or_fail("the forward");
#ifndef FLASHATTN_DISABLE_SM90
  const char* why_not_sm90 = sm90::fwd_unsupported_here(p);
#else
  const char* why_not_sm90 = "this build has no sm90 kernels (FLASHATTN_DISABLE_SM90, or "
                             "TORCH_CUDA_ARCH_LIST without 9.0 / 9.0a)";
#endif
  if (why_not_sm90 == nullptr) return Backend::kSm90;
  if (force == Force::kSm90)
    fail("FLASHATTN_FORCE_BACKEND=sm90, but the sm90 forward does not take this call: ",
         why_not_sm90);
  return sm80_or_fail("the forward");
}

// A CUDA call with a KV cache or paged keys (flash_attn_with_kvcache, block_table): the sm80
// append and split-KV kernels; sm90 has none yet.
inline Backend choose_fwd_kvcache() {
  if (forced_backend() == Force::kSm90)
    fail("FLASHATTN_FORCE_BACKEND=sm90, but the sm90 forward does not take this call: it has "
         "no KV-cache / paged-KV kernel yet");
  return sm80_or_fail("the KV-cache / paged-KV forward");
}

// The backward of a CUDA call. It has no sm90 kernel yet: sm80 under either
// FLASHATTN_FORCE_BACKEND value.
inline Backend choose_bwd() {
  forced_backend();  // a bad value raises here too
#ifdef FLASHATTN_DISABLE_BACKWARD
  fail("the backward on CUDA tensors needs the CUDA backward kernels, but this build has none "
       "(FLASHATTN_DISABLE_BACKWARD)");
#else
  return sm80_or_fail("the backward");
#endif
}

}  // namespace flashattn::api
