// The Hopper forward's compile-time shape (FwdConfig: head dims, tile, ring depth, schedule,
// shared-memory layout, register split; the 16-bit and FP8 variants) and what one tile of it
// covers (fwd_tile_info), shared by the kernel (kernel_fwd_sm90.cuh) and the FP8 on-chip V
// transpose (transpose_v_fp8_sm90.cuh).
#pragma once
#include <cstdint>

#include "../common/mask.h"
#include "../common/params.h"
#include "../common/seqlen.h"
#include "fp8_layout_sm90.h"
#include "tile_fwd_sm90.h"

namespace flashattn::sm90 {

// Compile-time shape of one kernel: head dims, tile, ring depth, consumer schedule, and
// kExpFma: every kExpFma-th 8-key column block of P takes its exponentials on the FMA units
// (exp2_fma), the rest on the SFU; 0: all on the SFU.
// (FA4's lazy rescaling and a cross-tile pipeline were tried in this slot and measured no
// gain, 2026-12-03: benchmarks/NOTES.md.)
// kDescBase (an experiment, 0 in the package): the WGMMA descriptors of each operand built once
// per tile / stage and moved by desc_add per k-step, the consumer's warpgroup index in a
// uniform register (at N = 512 ours executed 1.4x FA4's instructions, the extra integer and
// uniform ones, ~100 of them per key block rebuilding the 16 descriptors: NOTES, 2026-12-03).
// kVLate (the package's at d <= 128: tile_fwd_sm90.h's fwd_v_late): a steady-state step
// waits for V_j inside its turn, after issuing S_{j+1} = Q K_{j+1}^T, instead of before the
// turn (FA4's sm90 order: the producer loads K_{j+1} before V_j, so waiting for both first
// holds the next QK^T, and the other warpgroup's turn, until V_j lands).
// kInBytes: 2 (bf16 / fp16 inputs), or 1: the FP8 forward (issue 14; kFp8): Q, K e4m3 by TMA,
// V as the staging pass's V^T (stage_fp8_sm90.cuh: 8-bit WGMMAs take K-major operands only),
// S = Q K^T and O += P V as k32 e4m3 WGMMAs, P scaled by 2^8 (kFp8PLog2) and rounded to e4m3
// in registers, the descales folded into the tile's scale and the epilogue; out 16-bit.
template <int kD_, int kDv_, int kBM_, int kBN_, int kStages_, int kSchedule_, int kExpFma_ = 0,
          int kDescBase_ = 0, int kVLate_ = 0, int kInBytes_ = 2, int kVChip_ = 0>
struct FwdConfig {
  static constexpr int kD = kD_, kDv = kDv_, kBM = kBM_, kBN = kBN_, kStages = kStages_;
  static constexpr int kSchedule = kSchedule_, kExpFma = kExpFma_;
  static constexpr bool kDescBase = kDescBase_ != 0, kVLate = kVLate_ != 0;
  static constexpr int kInBytes = kInBytes_;
  static constexpr bool kFp8 = kInBytes == 1;
  static_assert(kInBytes == 2 || kInBytes == 1, "16-bit or e4m3 inputs");
  // kVChip (FP8): V^T made on chip instead of by the staging pass: TMA loads V as it lies
  // (rows of keys) into a raw ring, warps 1-3 of the producer warpgroup transpose each stage
  // into the V^T stage the consumers read (the same layout the staging pass gives), then
  // release the raw stage and arrive on the V^T stage's full barrier.
  static constexpr bool kVChip = kVChip_ != 0;
  static_assert(!kVChip || kInBytes == 1, "the on-chip transpose is FP8's");
  static_assert(!kFp8 || (kBN % 64 == 0 && !kDescBase),
                "FP8: whole 64- or 128-byte rows of V^T a step, no descriptor experiment");
  static_assert(kExpFma >= 0 && kExpFma <= kBN / 8, "a share of the column blocks");
  static constexpr int kConsumers = kBM / 64, kThreads = (kConsumers + 1) * 128;
  // One P buffer, packed after P V of the step before has read it (FP8 shapes whose second
  // buffer would spill: three consumer warpgroups' 160 registers; at d 256 it spilled more).
  static constexpr bool kOneP = kFp8 && kConsumers == 3;
  static_assert(kBM % 64 == 0 && (kConsumers == 2 || kConsumers == 3),
                "two or three consumer warpgroups of 64 query rows");
  static_assert(kD % 64 == 0 && kDv % 64 == 0, "tiles are 64-column chunks (128-byte swizzle)");
  static_assert(kBN % 16 == 0 && kBN <= 256 && kDv <= 256, "WGMMA N and TMA box limits");
  static_assert(kSchedule == kOverlap || kSchedule == kPingPong, "a known schedule");
  // A tile of R rows x C columns is stored as chunks of R rows x kQKChunkB bytes (128; FP8 rows
  // that are no multiple of 128 bytes, d 64 and 192: 64, with the 64-byte swizzle), each
  // kQKChunkCols columns. V: 16-bit, MN-major, kDv / 64 chunks of kBN rows x 128 bytes; FP8,
  // V^T (K-major), chunks of kDv rows x kVChunkB bytes (keys: 128, or 64 with the 64-byte
  // swizzle when kBN is no multiple of 128).
  static constexpr int kQKChunkB = (kD * kInBytes) % 128 == 0 ? 128 : 64;
  static constexpr int kQKChunks = kD * kInBytes / kQKChunkB, kQKChunkCols = kQKChunkB / kInBytes;
  static constexpr int kVChunkB = kFp8 && kBN % 128 != 0 ? 64 : 128;
  static constexpr int kVChunks = kFp8 ? kBN / kVChunkB : kDv / 64;
  static constexpr int kQChunk = kBM * kQKChunkB, kKChunk = kBN * kQKChunkB;
  static constexpr int kKVChunk = kBN * 128, kVChunk = kFp8 ? kDv * kVChunkB : kKVChunk;
  static constexpr int kQBytes = kBM * kD * kInBytes, kKBytes = kBN * kD * kInBytes;
  static constexpr int kVBytes = kBN * kDv * kInBytes;
  // kVChip's raw V stage: chunks of kBN rows (keys) x kVRawChunkB bytes of head-dim columns.
  static constexpr int kVRawChunkB = (kDv * kInBytes) % 128 == 0 ? 128 : 64;
  static constexpr int kVRawChunks = kDv * kInBytes / kVRawChunkB, kVRawChunk = kBN * kVRawChunkB;
  static_assert(!kFp8 || (kVChunkB == fp8_vt_row_bytes(kBN) &&
                          kVRawChunkB == fp8_v_raw_row_bytes(kDv)),
                "fp8_layout_sm90.h's row widths (tools/check_fp8_vchip.cpp plays the transpose)");
  static_assert(kQChunk % 1024 == 0 && kKChunk % 1024 == 0 && kVChunk % 1024 == 0 &&
                    kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0,
                "swizzle atoms (8 rows of 64 or 128 bytes) aligned in every chunk and stage");
  static constexpr int kSmemK = kQBytes, kSmemV = kSmemK + kStages * kKBytes;
  // The output's staging area (tile_fwd_sm90.h's fwd_o_stage_bytes; 0: none): each consumer's
  // 64 x kDv rows as kDv / 64 chunks of 64 rows x 128 bytes, the TMA store's boxes.
  static constexpr int kOBytes =
      fwd_o_stage_bytes(FwdTile{kBM, kBN, kStages, kSchedule}, kD, kDv, kInBytes);
  static constexpr bool kTmaO = kOBytes > 0;
  static constexpr int kSmemO = kSmemV + kStages * kVBytes, kOChunk = 64 * 128;
  static constexpr int kSmemVRaw = kSmemO + kOBytes;  // kVChip: the raw V ring
  static constexpr int kSmemBar = kSmemVRaw + (kVChip ? kStages * kVBytes : 0);
  static constexpr int kSmem = kSmemBar + 128 + 1024;  // + mbarriers, alignment slack
  static_assert(kSmem == fwd_smem_bytes(FwdTile{kBM, kBN, kStages, kSchedule}, kD, kDv, kInBytes) +
                             (kVChip ? kStages * kVBytes : 0),
                "tile_fwd_sm90.h's count");
  static_assert((2 + (kVChip ? 6 : 4) * kStages) * 8 <= 128, "the mbarriers fit their 128 bytes");
  static_assert(kSmemO % 1024 == 0 && (64 * kDv * 2) % 1024 == 0, "TMA boxes 1024-aligned");
  // Named barriers: 1 .. kConsumers the ping-pong turns, then one per consumer (its 128
  // threads) around its output's staging area.
  static constexpr int kBarO = 1 + kConsumers;
  static_assert(kSmem <= 232448, "Hopper's opt-in shared memory per block (227 KB)");
  // Registers per thread of the producer and of each consumer (a 64K file: sum <= 512).
  // (kVChip with two consumers: 40 for the transposing warps, as the block-sparse list warp.)
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : kVChip ? 40 : 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : kVChip ? 232 : 240;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= 512, "the register file");
};

// The package's shape of a variant (tile_fwd_sm90.h).
template <int kD, int kDv, bool kLocal>
using FwdConfigOf = FwdConfig<kD, kDv, fwd_tile(kD, kDv, kLocal).block_m,
                              fwd_tile(kD, kDv, kLocal).block_n, fwd_tile(kD, kDv, kLocal).stages,
                              fwd_tile(kD, kDv, kLocal).schedule, 0, 0, fwd_v_late(kD, kDv)>;
// The FP8 forward's shape (tile_fwd_sm90.h's fwd_tile_fp8; V late as the 16-bit kernels').
// kVChip: V^T transposed on chip (FwdConfig). FLASHATTN_SM90_FP8_EXPFMA (a build's A/B,
// default 0): every n-th 8-key column block of P takes its exponentials on the FMA units
// (exp2_fma), the exp-bound FP8 case the issue names for FA4's trick; not yet timed.
#ifndef FLASHATTN_SM90_FP8_EXPFMA
#define FLASHATTN_SM90_FP8_EXPFMA 0
#endif
// kShape: the tile of fwd_tile_fp8 (kFp8Tile), fwd_tile_fp8_long (kFp8Long) or
// fwd_tile_fp8_short_local (kFp8Short).
enum Fp8Shape : int { kFp8Tile = 0, kFp8Long = 1, kFp8Short = 2 };
constexpr FwdTile fwd_tile_fp8_of(int d, int dv, int shape) {
  return shape == kFp8Long    ? fwd_tile_fp8_long(d, dv)
         : shape == kFp8Short ? fwd_tile_fp8_short_local(d, dv)
                              : fwd_tile_fp8(d, dv);
}
template <int kD, int kDv, int kVChip = 0, int kShape = kFp8Tile>
using FwdConfigFp8 =
    FwdConfig<kD, kDv, fwd_tile_fp8_of(kD, kDv, kShape).block_m,
              fwd_tile_fp8_of(kD, kDv, kShape).block_n, fwd_tile_fp8_of(kD, kDv, kShape).stages,
              fwd_tile_fp8_of(kD, kDv, kShape).schedule, FLASHATTN_SM90_FP8_EXPFMA, 0,
              fwd_v_late(kD, kDv), 1, kVChip>;
// FLASHATTN_SM90_SKIP_RESCALE (a build's A/B, default 0; written 2026-12-06; ran 0.93-0.97x at
// d 128 FP8 on an H100, where ptxas had also moved P V's wait, see below): a warp skips O's
// rescale after a key block that moved none of its rows' maxima (a vote; alpha is then exactly
// 1), kDv / 2 multiplies a thread a block (at d 256 with FP8's 64 keys, as many as its
// exponentials) that otherwise sit between P V's wait and the next turn.
// 1: in the FP8 kernels; 2: in the 16-bit ones too (not with dropout).
#ifndef FLASHATTN_SM90_SKIP_RESCALE
#define FLASHATTN_SM90_SKIP_RESCALE 0
#endif
// The consumer loop's schedule, build-time A/Bs (written 2026-12-06, fourth session, from a
// reading of the SASS, benchmarks/notes/fp8_d128_sass_20261206.md; default 0 leaves the SASS as
// it was; not yet run on a GPU). ptxas moves step()'s wait<0> (P V_it) above the next block's
// softmax and gives the two P buffers one set of registers, so the binary has no
// intra-warpgroup overlap (d 128 FP8 and bf16 alike).
// FLASHATTN_SM90_FWD_WAIT_EARLY=1: that wait written where ptxas puts it (before the softmax),
// so that schedule and SKIP_RESCALE can be timed apart.
// FLASHATTN_SM90_FWD_ONE_P=1: one P buffer packed after the wait (kOneP's order) in every
// forward kernel.
// FLASHATTN_SM90_FWD_SPLIT=2: a branch on the block's row sums (never taken) just before the
// wait, a basic-block boundary ptxas does not hoist the wait over: the overlap the source means.
#ifndef FLASHATTN_SM90_FWD_WAIT_EARLY
#define FLASHATTN_SM90_FWD_WAIT_EARLY 0
#endif
#ifndef FLASHATTN_SM90_FWD_ONE_P
#define FLASHATTN_SM90_FWD_ONE_P 0
#endif
#ifndef FLASHATTN_SM90_FWD_SPLIT
#define FLASHATTN_SM90_FWD_SPLIT 0
#endif
// FLASHATTN_SM90_FWD_SEED_CHAINS=1: the softmax's four row-max / row-sum chains start from their
// first values instead of -inf / 0 (the same results; 14 instructions fewer a block and thread).
#ifndef FLASHATTN_SM90_FWD_SEED_CHAINS
#define FLASHATTN_SM90_FWD_SEED_CHAINS 0
#endif
// FP8: P is scaled by 2^kFp8PLog2 before its rounding to e4m3 (tests/reference.py's emulation:
// its normal range then reaches 2^-14 of the row's largest), which the row sum carries too.
inline constexpr float kFp8PLog2 = 8.f;

// What one tile (kBM query rows of one head of one sequence) covers.
struct FwdTileInfo {
  SeqInfo si;
  int m0, h, b, hk;
  MaskInfo mi;
  MaskInfo::BlockRange kbl;
  int n_iters;  // key blocks; 0: nothing to load (rows past the sequence, or no visible key)
};
// Tile order: (head, sequence) pairs in groups of `group` (sized on the host so a group's K / V
// fits in L2), within a group query blocks from the last (the longest, for causal) down, the
// group's pairs fastest. Position `tile` of that list:
template <int kBM, int kBN>
__device__ __forceinline__ FwdTileInfo fwd_tile_info(const FwdParams& p, int tile, int m_blocks,
                                                     int group) {
  FwdTileInfo t;
  const int pairs = p.nheads * p.batch, g = tile / (group * m_blocks);
  const int r = tile - g * group * m_blocks, in_group = min(group, pairs - g * group);
  const int m_block = m_blocks - 1 - r / in_group, hb = g * group + r % in_group;
  t.h = hb % p.nheads;
  t.b = hb / p.nheads;
  t.hk = t.h / (p.nheads / p.nheads_k);
  t.si = seq_info(p, t.b);
  t.m0 = m_block * kBM;
  t.mi = MaskInfo{t.si.seqlen_q, t.si.seqlen_k, p.window_left, p.window_right,
                  pos_shift_of(p, t.b)};
  t.kbl = t.m0 < t.si.seqlen_q
              ? t.mi.key_blocks(t.m0, min(t.m0 + kBM, t.si.seqlen_q) - 1, kBN)
              : MaskInfo::BlockRange{0, 0};
  t.n_iters = t.kbl.hi - t.kbl.lo;
  return t;
}

}  // namespace flashattn::sm90
