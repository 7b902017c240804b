// The FP8 forward's staging pass (issue 14; kernel_fwd_sm90.cuh's kFp8), run before the
// kernel on its stream, into the workspace the API allocates (fwd_workspace): V^T always, Q
// and K where TMA cannot read them in place (the layouts: fp8_layout_sm90.h).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>

#include "../common/cuda_check.h"
#include "fp8_layout_sm90.h"

namespace flashattn::sm90 {

// A thread: 4 head-dim columns x 16 keys of one (sequence, KV head), transposed in registers
// (8 byte permutes) into 4 V^T rows of 16 bytes, stored whole; lanes column-group fastest, so
// a load reads 32 contiguous bytes of a row and 4 lanes' stores 64 of a V^T row. A warp: 32
// columns x 64 keys, a block 512 keys (blockIdx.z: the 32-column slice), grid-striding over
// the sequence's keys up to its length rounded to 32 (zeros past the length). kWords: v's
// address, strides and headdim_v are multiples of 4 (4-byte loads), else byte loads.
// (2026-12-06, H100: the 64 x 64 shared-memory version took 43 us for d128's 32 MB at 16k.)
template <bool kWords>
__global__ void __launch_bounds__(256)
    fp8_vt_kernel(const __grid_constant__ FwdParams p, uint8_t* vt, int64_t pitch) {
  const int hk = static_cast<int>(blockIdx.x % p.nheads_k), b = static_cast<int>(blockIdx.x / p.nheads_k);
  const SeqInfo si = seq_info(p, b);
  const int lane = threadIdx.x & 31, col = blockIdx.z * 32 + (lane & 7) * 4;
  if (col >= p.headdim_v) return;  // no block-wide barrier below
  const int len32 = (si.seqlen_k + 31) & ~31;
  const uint8_t* v = static_cast<const uint8_t*>(p.v_ptr) + b * p.v_batch_stride +
                     hk * p.v_head_stride + si.k_row0 * p.v_row_stride + col;
  uint8_t* out = vt + int64_t(col) * pitch +
                 (p.is_varlen ? int64_t(hk) * p.headdim_v * pitch + vt_seq_col0(si.k_row0, b)
                              : (int64_t(b) * p.nheads_k + hk) * p.headdim_v * pitch);
  const int ncols = min(4, p.headdim_v - col);
  for (int k0 = blockIdx.y * 512 + (threadIdx.x >> 5) * 64 + (lane >> 3) * 16; k0 < len32;
       k0 += gridDim.y * 512) {  // k0 a multiple of 16, len32 of 32: the group is whole
    uint32_t r[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      r[i] = 0;
      if (k0 + i < si.seqlen_k) {
        const uint8_t* src = v + int64_t(k0 + i) * p.v_row_stride;
        if constexpr (kWords) {
          r[i] = *reinterpret_cast<const uint32_t*>(src);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (j < ncols) r[i] |= uint32_t(src[j]) << (8 * j);
        }
      }
    }
    // Column position 4 t + n of the group holds key vt_key_of: 2 t, 2 t + 1, 2 t + 8, 2 t + 9
    // for n = 0..3; a 4 x 4 byte transpose of those rows gives each column's word t.
    uint32_t w[4][4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint32_t lo01 = __byte_perm(r[2 * t], r[2 * t + 1], 0x5140);
      const uint32_t hi01 = __byte_perm(r[2 * t], r[2 * t + 1], 0x7362);
      const uint32_t lo89 = __byte_perm(r[2 * t + 8], r[2 * t + 9], 0x5140);
      const uint32_t hi89 = __byte_perm(r[2 * t + 8], r[2 * t + 9], 0x7362);
      w[0][t] = __byte_perm(lo01, lo89, 0x5410);
      w[1][t] = __byte_perm(lo01, lo89, 0x7632);
      w[2][t] = __byte_perm(hi01, hi89, 0x5410);
      w[3][t] = __byte_perm(hi01, hi89, 0x7632);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < ncols)
        *reinterpret_cast<uint4*>(out + j * pitch + k0) =
            make_uint4(w[j][0], w[j][1], w[j][2], w[j][3]);
  }
}

// Rows of a (rows, heads, cols) byte tensor at (row, head) strides -> a packed copy of pitch
// bytes a (row, head); padded batches count rows b * seqlen + i (the batch stride given).
// (A template, as fp8_vt_kernel: a plain __global__ defined in a header is a strong symbol in
// every object that includes it, and the sm90 objects link into one library.)
template <int = 0>
__global__ void __launch_bounds__(256)
    fp8_pack_rows_kernel(const uint8_t* src, int64_t rows, int seqlen, int heads, int cols,
                         int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                         uint8_t* dst, int64_t pitch) {
  const int64_t n = rows * heads * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % cols);
    const int64_t rh = i / cols, r = rh / heads;
    const int h = static_cast<int>(rh % heads);
    const int64_t b = seqlen > 0 ? r / seqlen : 0, s = seqlen > 0 ? r % seqlen : r;
    dst[rh * pitch + c] = src[b * batch_stride + s * row_stride + h * head_stride + c];
  }
}

// The staging pass of a call: V^T (but for the on-chip transpose), Q / K (/ V) where
// fp8_stage_of says so. ws: the workspace (at least s.total bytes, zeroed for varlen calls).
inline void run_fp8_stage(const FwdParams& p, const Fp8Stage& s, uint8_t* ws,
                          cudaStream_t stream) {
  if (p.nheads_k <= 0 || p.batch <= 0 || p.headdim_v <= 0) return;
  const int64_t pairs = int64_t(p.batch) * p.nheads_k;
  if (pairs > INT32_MAX) throw std::runtime_error("flashattn sm90 fp8: 2^31 (batch, KV head) pairs or more");
  const int64_t key_tiles = (int64_t(p.seqlen_k) + 511) / 512;
  const dim3 grid(static_cast<unsigned>(pairs),
                  static_cast<unsigned>(key_tiles < 1 ? 1 : key_tiles > 65535 ? 65535 : key_tiles),
                  static_cast<unsigned>((p.headdim_v + 31) / 32));
  const bool words = reinterpret_cast<uintptr_t>(p.v_ptr) % 4 == 0 && p.v_row_stride % 4 == 0 &&
                     p.v_head_stride % 4 == 0 && p.v_batch_stride % 4 == 0 && p.headdim_v % 4 == 0;
  if (!s.vchip) {
    if (words) fp8_vt_kernel<true><<<grid, 256, 0, stream>>>(p, ws, s.vt_pitch);
    else fp8_vt_kernel<false><<<grid, 256, 0, stream>>>(p, ws, s.vt_pitch);
    FLASHATTN_LAUNCH_CHECK();
  }
  auto pack = [&](const void* src, int heads, int cols, int64_t rs, int64_t hs, int64_t bs,
                  bool is_q, uint8_t* dst, int64_t pitch) {
    const int64_t rows = p.is_varlen ? (is_q ? p.total_q : p.total_k)
                                     : int64_t(p.batch) * (is_q ? p.seqlen_q : p.seqlen_k);
    const int64_t n = rows * heads * cols;
    if (n <= 0) return;
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535 * 8);
    fp8_pack_rows_kernel<><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        static_cast<const uint8_t*>(src), rows,
        p.is_varlen ? 0 : (is_q ? p.seqlen_q : p.seqlen_k), heads, cols, rs, hs, bs, dst, pitch);
    FLASHATTN_LAUNCH_CHECK();
  };
  if (s.q)
    pack(p.q_ptr, p.nheads, p.headdim, p.q_row_stride, p.q_head_stride, p.q_batch_stride, true,
         ws + s.q_off, s.q_pitch);
  if (s.k)
    pack(p.k_ptr, p.nheads_k, p.headdim, p.k_row_stride, p.k_head_stride, p.k_batch_stride,
         false, ws + s.k_off, s.k_pitch);
  if (s.v)
    pack(p.v_ptr, p.nheads_k, p.headdim_v, p.v_row_stride, p.v_head_stride, p.v_batch_stride,
         false, ws + s.v_off, s.v_pitch);
}

// q / k as the kernel reads them after the staging: the staged copies' pointers and strides
// (elements = bytes) where they were staged.
inline FwdParams fp8_staged_params(const FwdParams& p, const Fp8Stage& s, uint8_t* ws) {
  FwdParams q = p;
  if (s.q) {
    q.q_ptr = ws + s.q_off;
    q.q_head_stride = s.q_pitch;
    q.q_row_stride = s.q_pitch * p.nheads;
    q.q_batch_stride = p.is_varlen ? 0 : q.q_row_stride * p.seqlen_q;
  }
  if (s.v) {
    q.v_ptr = ws + s.v_off;
    q.v_head_stride = s.v_pitch;
    q.v_row_stride = s.v_pitch * p.nheads_k;
    q.v_batch_stride = p.is_varlen ? 0 : q.v_row_stride * p.seqlen_k;
  }
  if (s.k) {
    q.k_ptr = ws + s.k_off;
    q.k_head_stride = s.k_pitch;
    q.k_row_stride = s.k_pitch * p.nheads_k;
    q.k_batch_stride = p.is_varlen ? 0 : q.k_row_stride * p.seqlen_k;
  }
  return q;
}

}  // namespace flashattn::sm90
