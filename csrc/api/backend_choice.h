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
// kSm80Decode: the split-KV decode kernels (sm80 family) for calls with few query rows.
enum class Backend { kCpu, kSm80, kSm80Ptx, kSm90, kSm80Decode };

inline const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kCpu: return "cpu";
    case Backend::kSm80: return "sm80";
    case Backend::kSm80Ptx: return "sm80-ptx";
    case Backend::kSm90: return "sm90";
    case Backend::kSm80Decode: return "sm80-decode";
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

// Issue 14's FP8 forward: the sm90 kernel (e4m3 WGMMA, sm_90a code) or a named error, never
// another dtype's kernel: other GPUs get the first error for good; on Hopper, a call the sm90
// forward does not take (why: its reason) or a build without sm90 kernels the second.
[[noreturn]] inline void fail_cuda_fp8(const char* why) {
  int cc = 0;  // the current device's compute capability, where this build can ask
#ifndef FLASHATTN_DISABLE_SM80
  sm80::device_fit(cc);
#endif
  if (cc != 0 && cc != 90)
    fail("FP8 attention needs an sm90 (Hopper) GPU: its kernel is sm_90a code (e4m3 WGMMA), "
         "this GPU has compute capability ", cc / 10, ".", cc % 10, "; FP8 runs on CPU tensors");
  fail("the sm90 FP8 forward does not take this call: ", why,
       "; FP8 (float8_e4m3fn) attention also runs on CPU tensors");
}

// Issue 17's position offsets on CUDA: the sm80 / sm90 main kernels take them in their mask
// and ALiBi (MaskInfo::pos_shift, int32: sequences and window sides below 2^28 so no sum of
// a row, a shift of up to 2^30 and a window overflows); the deterministic backwards' orders
// count key blocks from the shifted diagonal (sm80: bwd_order_sm80.h on MaskInfo; sm90:
// bwd_det_turn); dropout's keep mask takes them in the sm90 kernels only (dropout_lanes.cuh:
// whole 16 x 16 blocks when both offsets are multiples of 16, else cell by cell, in a second
// instantiation of each dropout kernel), so a dropout call with offsets that would run an sm80
// kernel raises (fail_sm80_dropout_offsets: second bodies doubled the sm80 dropout kernels'
// compile time, 21 -> 36 s a file, the build past its 15-minute budget); the decode
// kernels never see them (decode_shaped).
inline constexpr int64_t kCudaPosOffsetLimit = int64_t(1) << 28;
inline void check_cuda_pos_offsets(const FwdParams& p) {
  if (p.q_pos_offset == nullptr && p.k_pos_offset == nullptr) return;
  if (p.seqlen_q >= kCudaPosOffsetLimit || p.seqlen_k >= kCudaPosOffsetLimit ||
      p.window_left >= kCudaPosOffsetLimit || p.window_right >= kCudaPosOffsetLimit)
    fail("q_pos_offset / k_pos_offset on CUDA take sequences (max_seqlen for varlen) and "
         "window sides below 2^28, got seqlen_q ", p.seqlen_q, ", seqlen_k ", p.seqlen_k,
         ", window (", p.window_left, ", ", p.window_right, ")");
}

#ifdef FLASHATTN_DISABLE_BLOCK_SPARSE
[[noreturn]] inline void fail_no_block_sparse_build() {
  fail("this build has no CUDA block-sparse kernels (FLASHATTN_DISABLE_BLOCK_SPARSE=1): "
       "block-sparse attention runs on CPU tensors");
}
#endif

// Dropout with position offsets (params.h's dropout_offsets_call) where the sm80 kernels would
// run it (see above).
[[noreturn]] inline void fail_sm80_dropout_offsets(const char* what, const char* why_not_sm90) {
  fail("dropout with position offsets (q_pos_offset / k_pos_offset) on CUDA runs on the sm90 "
       "(Hopper) kernels only, and ", what, " of this call would run the sm80 kernels (",
       why_not_sm90, "); it runs on CPU tensors (ring attention with dropout_p > 0 too)");
}

inline void check_cuda_has_features(const FwdParams& p) {
#ifdef FLASHATTN_DISABLE_DROPOUT
  if (p.dropout_threshold > 0)
    fail("this build has no CUDA dropout kernels (FLASHATTN_DISABLE_DROPOUT=1): dropout runs on "
         "CPU tensors");
#endif
#ifdef FLASHATTN_DISABLE_BLOCK_SPARSE
  if (p.kv_num_blocks != nullptr) fail_no_block_sparse_build();
#endif
  check_cuda_pos_offsets(p);
}

// The forward's backend for a CUDA call whose params are filled (output pointers may be null
// when only asking); the caller holds a device guard for q's device. CPU calls run kCpu.
// Decoding-shaped: at most 64 query rows per KV head (tokens x the heads of a KV group) over
// at least 512 keys. The main kernels' 128-row tiles would be mostly empty and one CTA per
// (head, batch) would leave most SMs idle; the decode kernels pack a KV group's rows into one
// tile and split the keys across CTAs (H200: see benchmarks/results, decode rows).
inline bool decode_shaped(const FwdParams& p) {
  const int64_t rows = int64_t(p.seqlen_q) * (p.nheads / p.nheads_k);
  return rows <= 64 && p.seqlen_k >= 512 && p.dropout_threshold == 0 &&
         p.kv_num_blocks == nullptr &&  // no dropout, no block mask, no position offsets there
         p.q_pos_offset == nullptr && p.k_pos_offset == nullptr;
}

inline Backend choose_fwd(const FwdParams& p) {
  const Force force = forced_backend();
  check_cuda_has_features(p);
  if (p.dtype == DType::kFloat8E4M3) {  // sm90 alone, whatever the shape or the forced backend
#ifndef FLASHATTN_DISABLE_SM90
    if (const char* why = sm90::fwd_unsupported_here(p)) fail_cuda_fp8(why);
    return Backend::kSm90;
#else
    fail_cuda_fp8("this build has no sm90 kernels (FLASHATTN_DISABLE_SM90, or "
                  "TORCH_CUDA_ARCH_LIST without 9.0 / 9.0a)");
#endif
  }
  if (force == Force::kSm80) {
    if (dropout_offsets_call(p))
      fail_sm80_dropout_offsets("the forward", "FLASHATTN_FORCE_BACKEND=sm80");
    return sm80_or_fail("the forward");
  }
#ifndef FLASHATTN_DISABLE_SM80
  if (force == Force::kAuto && decode_shaped(p)) {
    sm80_or_fail("the forward");  // the device runs the sm80 family (or a named error)
    return Backend::kSm80Decode;
  }
#endif
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
  if (dropout_offsets_call(p)) fail_sm80_dropout_offsets("the forward", why_not_sm90);
  return sm80_or_fail("the forward");
}

// A CUDA call with a KV cache or paged keys (flash_attn_with_kvcache, block_table): the sm80
// append and split-KV kernels; sm90 has none yet.
inline Backend choose_fwd_kvcache(const FwdParams& p) {
  check_cuda_has_features(p);
  if (p.dropout_threshold > 0)
    fail("dropout with a KV cache or paged keys (block_table) on CUDA is not built: the "
         "split-KV kernels take dropout_p = 0 only (got ", p.dropout_p, "); it runs on CPU "
         "tensors, or on CUDA without block_table");
  if (forced_backend() == Force::kSm90)
    fail("FLASHATTN_FORCE_BACKEND=sm90, but the sm90 forward does not take this call: it has "
         "no KV-cache / paged-KV kernel yet");
  return sm80_or_fail("the KV-cache / paged-KV forward");
}

// The backward of a CUDA call whose params are filled (gradient pointers may be null when only
// asking). sm90 where its backward takes the call (buckets 64 / 128 / 256; 96 / 192 on the next
// kernel up unless FLASHATTN_SM90_BWD_PAD=0; softcap / ALiBi not
// with dropout or a block mask, deterministic unless FLASHATTN_SM90_DET_BWD=0,
// TMA-addressable), else sm80 -- also under FLASHATTN_FORCE_BACKEND=sm90, which forces the
// forward (the sm90 backward covers less; kernel_path says which runs);
// FLASHATTN_FORCE_BACKEND=sm80 forces both directions.
inline Backend choose_bwd(const BwdParams& p) {
  const Force force = forced_backend();  // a bad value raises here too
  check_cuda_has_features(p);
#ifdef FLASHATTN_DISABLE_BLOCK_SPARSE
  if (p.q_num_blocks != nullptr) fail_no_block_sparse_build();
#endif
#ifdef FLASHATTN_DISABLE_BACKWARD
  (void)p;
  (void)force;
  fail("the backward on CUDA tensors needs the CUDA backward kernels, but this build has none "
       "(FLASHATTN_DISABLE_BACKWARD)");
#else
#ifndef FLASHATTN_DISABLE_SM90
  const char* why_not_sm90 = force == Force::kSm80 ? "FLASHATTN_FORCE_BACKEND=sm80"
                                                   : sm90::bwd_unsupported_here(p);
  if (why_not_sm90 == nullptr) return Backend::kSm90;
#else
  (void)force;
  const char* why_not_sm90 = "this build has no sm90 kernels";
#endif
  if (dropout_offsets_call(p)) fail_sm80_dropout_offsets("the backward", why_not_sm90);
  return sm80_or_fail("the backward");
#endif
}

}  // namespace flashattn::api
