// The FP8 forward's staged layouts (issue 14), shared by the staging pass
// (stage_fp8_sm90.cuh), the kernel (kernel_fwd_sm90.cuh's kFp8) and the host check
// (tools/check_fp8_stage.cpp). Torch-free and CUDA-free.
// - V^T. 8-bit WGMMAs read both operands K-major, so P V needs V with its keys contiguous. Per
//   (sequence, KV head), one row of keys per head-dim column c < headdim_v:
//     padded: vt[((b * nheads_k + hk) * headdim_v + c) * pitch + L], pitch = seqlen_k rounded
//             up to 32;
//     varlen: vt[(hk * headdim_v + c) * pitch + vt_seq_col0(k_row0, b) + L], pitch =
//             total_k rounded up to 128 plus kVtRoom per sequence: disjoint, 128-aligned
//             regions, each its length rounded up to the widest key block the kernel reads
//             long (past the rounded length to 32, zeros of the zeroed workspace);
//   L is the key's column: within each group of 32 keys, key 16 h + 8 a + 2 t + e sits at
//   column 16 h + 4 t + 2 a + e (vt_col_of), the order of the e4m3 P registers the kernel
//   packs from its S accumulators without any shuffle (kernel_fwd_sm90.cuh's softmax). The
//   keys past the sequence up to the next multiple of 32 are written as zeros (P is 0 there,
//   but 0 x NaN is NaN in the MMA); varlen's gaps between regions come from the zeroed
//   workspace; TMA reads past the pitch as zeros.
// - Q and K when TMA cannot read them where they are (a stride or the address not a multiple of
//   16 bytes, e.g. head dims that are not multiples of 16, or strided views): rows copied to a
//   packed (rows, heads, round_up(headdim, 16)) copy; the kernel's tensor maps keep the head
//   dim as their extent, so the pad bytes are never read.
#pragma once
#include <cstdint>

#include "../common/params.h"
#include "../common/seqlen.h"
#include "tile_fwd_sm90.h"

namespace flashattn::sm90 {

// Key -> its V^T column within the key's group of 32, and back (the column's key).
FLASHATTN_HOST_DEVICE int vt_col_of(int key) {
  const int l = key & 31;
  return (key & ~31) | (l & 16) | (((l >> 1) & 3) << 2) | (((l >> 3) & 1) << 1) | (l & 1);
}
FLASHATTN_HOST_DEVICE int vt_key_of(int col) {
  const int l = col & 31;
  return (col & ~31) | (l & 16) | (((l >> 1) & 1) << 3) | (((l >> 2) & 3) << 1) | (l & 1);
}
// The e4m3 P registers (kernel_fwd_sm90.cuh's pack_p): register r of a k32 slab's A fragment
// holds row g + 8 (r & 1) at columns 4 (lane % 4) + i + 16 (r >> 1), i < 4 (byte i); the
// thread has, of the slab's four n8 blocks of S, element e of block j at row g + 8 (e >> 1),
// column 8 j + 2 (lane % 4) + (e & 1), stored at s[4 j + e]. Byte i of register r packs
// s[fp8_pack_idx(r, i)] ({0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}): row
// half r & 1, key 16 (r >> 1) + 8 (i >> 1) + 2 (lane % 4) + (i & 1), which vt_key_of puts at
// column 16 (r >> 1) + 4 (lane % 4) + i. (A function: device code may not index a namespace-
// scope constexpr array.)
FLASHATTN_HOST_DEVICE constexpr int fp8_pack_idx(int r, int i) {
  return 8 * (r >> 1) + 2 * (r & 1) + 4 * (i >> 1) + (i & 1);
}

// Varlen: a sequence's region starts at its first key rounded up to 128, plus kVtRoom for each
// sequence before it, so that its last key block (blocks of up to 192 keys from the region's
// start) ends before the next region (tools/check_fp8_stage.cpp: every start mod 256, every
// length below 1024).
inline constexpr int kVtRoom = 256;
static_assert(fwd_fp8_block_n_max() <= 192, "kVtRoom holds key blocks of up to 192");
// Varlen: the first V^T column of sequence b, whose keys start at row k_row0 of k / v.
FLASHATTN_HOST_DEVICE int64_t vt_seq_col0(int64_t k_row0, int b) {
  return ((k_row0 + 127) & ~int64_t(127)) + kVtRoom * int64_t(b);
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline bool tma_bytes_ok(const void* ptr, int64_t a, int64_t b, int64_t c) {
  auto one = [](int64_t x) { return x >= 0 && x < (int64_t(1) << 40) && x % 16 == 0; };
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && one(a) && one(b) && one(c);
}

// Where the staged inputs go in the workspace (byte offsets, each 256-aligned), and their
// layouts. q / k (/ v) staged: q_pitch / k_pitch (/ v_pitch) bytes a row of one head. vchip:
// the kernel transposes V on chip (kernel_fwd_sm90.cuh's kVChip): no V^T, but v staged too
// where TMA cannot read it.
struct Fp8Stage {
  bool vchip = false;
  int64_t vt_pitch = 0, vt_bytes = 0;
  bool q = false, k = false, v = false;
  int64_t q_pitch = 0, k_pitch = 0, v_pitch = 0, q_off = 0, k_off = 0, v_off = 0, total = 0;
};

inline Fp8Stage fp8_stage_of(const FwdParams& p, bool vchip) {
  Fp8Stage s;
  s.vchip = vchip;
  const int64_t rows_q = p.is_varlen ? p.total_q : int64_t(p.batch) * p.seqlen_q;
  const int64_t rows_k = p.is_varlen ? p.total_k : int64_t(p.batch) * p.seqlen_k;
  s.vt_pitch = p.is_varlen ? round_up(p.total_k, 128) + kVtRoom * int64_t(p.batch)
                           : round_up(p.seqlen_k, 32);
  s.vt_bytes = vchip ? 0 : int64_t(p.is_varlen ? 1 : p.batch) * p.nheads_k * p.headdim_v * s.vt_pitch;
  s.q = !tma_bytes_ok(p.q_ptr, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
  s.k = !tma_bytes_ok(p.k_ptr, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
  s.q_pitch = round_up(p.headdim, 16);
  s.k_pitch = s.q_pitch;
  s.q_off = round_up(s.vt_bytes, 256);
  const int64_t q_bytes = s.q ? rows_q * p.nheads * s.q_pitch : 0;
  s.k_off = round_up(s.q_off + q_bytes, 256);
  const int64_t k_bytes = s.k ? rows_k * p.nheads_k * s.k_pitch : 0;
  s.v = vchip && !tma_bytes_ok(p.v_ptr, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
  s.v_pitch = round_up(p.headdim_v, 16);
  s.v_off = round_up(s.k_off + k_bytes, 256);
  const int64_t v_bytes = s.v ? rows_k * p.nheads_k * s.v_pitch : 0;
  s.total = s.v_off + v_bytes;
  return s;
}

}  // namespace flashattn::sm90
