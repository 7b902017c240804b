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

// Row widths of kVChip's stages (FwdConfig's kVRawChunkB and FP8 kVChunkB): raw V rows of dv
// head-dim bytes in 128-byte chunks where dv is a multiple of 128, else 64; V^T rows of the key
// block's bn keys likewise.
FLASHATTN_HOST_DEVICE constexpr int fp8_v_raw_row_bytes(int dv) { return dv % 128 == 0 ? 128 : 64; }
FLASHATTN_HOST_DEVICE constexpr int fp8_vt_row_bytes(int bn) { return bn % 128 == 0 ? 128 : 64; }
// kVChip's on-chip transpose (transpose_v_fp8_sm90.cuh), shared with its host check
// (tools/check_fp8_vchip.cpp). One warp op moves 32 keys (32 g .. 32 g + 31) x 16 head-dim
// bytes (d0 .. d0 + 15) of a raw V stage (key rows) into the V^T stage (head-dim rows, keys in
// vt_col_of's order):
// - ldmatrix.x4.trans (b16): lane l gives the row of key 32 g + l, so matrix j holds keys
//   32 g + 8 j .. + 7; transposed, register j of lane l holds keys 32 g + 8 j + 2 (l % 4) + {0,
//   1} (low, high half) at bytes d0 + 2 (l / 4) + {0, 1} (the half's low, high byte);
// - four byte permutes: keys {+0, +1, +8, +9} of one head-dim byte into one word, the word of
//   V^T columns 32 g + 16 h + 4 (l % 4) .. + 3 (h: registers 2 h, 2 h + 1) at row d0 + 2 (l / 4)
//   (selector 0x6420) or + 1 (0x7531);
// - stmatrix.x4 (b16): matrix m = 2 h + s takes those words of every lane, row i from lanes
//   4 i .. 4 i + 3 (16 bytes of one V^T row). Lanes 16-31 swap their two words (the selectors
//   of vchip_sel), so matrix s's rows are d0 + 2 i + (i >= 4 ^ s): 8 distinct rows mod 8, no
//   bank conflict in either swizzle (and the ldmatrix rows are 8 consecutive keys).
// Byte b of row `row` of rows of w bytes (128 or 64) in TMA's w-byte swizzle (16-byte unit b / 16
// XOR row % 8, or (row / 2) % 4).
FLASHATTN_HOST_DEVICE constexpr uint32_t vchip_swz(int w, int row, int b) {
  const int x = w == 128 ? row & 7 : (row >> 1) & 3;
  return uint32_t(row * w + ((((b >> 4) ^ x)) << 4) + (b & 15));
}
// The byte-permute selector of lane l's word s of a register pair (s = 0: the matrix of rows
// d0 + 2 i for i < 4).
FLASHATTN_HOST_DEVICE constexpr uint32_t vchip_sel(int lane, int s) {
  return ((lane >> 4) ^ s) ? 0x7531u : 0x6420u;
}
// The V^T row (minus d0) and column (minus 32 g) of the stmatrix row address lane l gives.
FLASHATTN_HOST_DEVICE constexpr int vchip_st_row(int lane) {
  return 2 * (lane & 7) + (((lane & 7) >> 2) ^ ((lane >> 3) & 1));
}
FLASHATTN_HOST_DEVICE constexpr int vchip_st_col(int lane) { return 16 * (lane >> 4); }
// Register j of a lane (keys kr = 32 g + 8 j + 2 (lane % 4) and kr + 1) with the keys at or past
// `valid` zeroed (the last key block of a sequence).
FLASHATTN_HOST_DEVICE constexpr uint32_t vchip_mask(uint32_t r, int kr, int valid) {
  return kr >= valid ? 0u : kr + 1 >= valid ? r & 0xffffu : r;
}
// The shared-memory offsets of op (g, d0) of a lane, in raw chunks of raw_w-byte rows
// (raw_chunk bytes: kBN rows) and V^T chunks of vt_w-byte rows (vt_chunk bytes: kDv rows):
// vchip_swz's terms that depend on the lane alone, once (d0 is a multiple of 16 and 32 g of 8,
// so the swizzle's XOR takes the lane's row bits only), then a few operations an op.
struct VchipLane {
  uint32_t ld_row, ld_x;  // ldmatrix: key 32 g + lane's row (lane * raw_w), its XOR
  uint32_t st_row, st_x;  // stmatrix: head-dim byte d0 + vchip_st_row's row, its XOR
  uint32_t st_col;        // column 32 g + st_col
};
FLASHATTN_HOST_DEVICE constexpr VchipLane vchip_lane(int raw_w, int vt_w, int lane) {
  return VchipLane{uint32_t(lane * raw_w), vchip_swz(raw_w, lane, 0) % uint32_t(raw_w),
                   uint32_t(vchip_st_row(lane) * vt_w),
                   vchip_swz(vt_w, vchip_st_row(lane), 0) % uint32_t(vt_w),
                   uint32_t(vchip_st_col(lane))};
}
FLASHATTN_HOST_DEVICE constexpr uint32_t vchip_ld_off(const VchipLane& l, uint32_t raw_w,
                                                       uint32_t raw_chunk, uint32_t g,
                                                       uint32_t d0) {
  return l.ld_row + g * (32 * raw_w) + d0 / raw_w * raw_chunk + ((d0 % raw_w) ^ l.ld_x);
}
FLASHATTN_HOST_DEVICE constexpr uint32_t vchip_st_off(const VchipLane& l, uint32_t vt_w,
                                                       uint32_t vt_chunk, uint32_t g,
                                                       uint32_t d0) {
  return l.st_row + (32 * g + l.st_col) / vt_w * vt_chunk + d0 * vt_w +
         (((32 * g + l.st_col) % vt_w) ^ l.st_x);
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
