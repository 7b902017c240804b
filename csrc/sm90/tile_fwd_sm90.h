// Tile policy of the Hopper forward: which head dims have sm90 kernels, and their tiles.
// Each choice with its measured reason (H200; tools/selftest/selftest_fwd_sm90,
// benchmarks/NOTES.md).
#pragma once

#ifndef FLASHATTN_SM90_FWD_STAGES  // K / V ring depth (d128: 3 stages measured no gain)
#define FLASHATTN_SM90_FWD_STAGES 2
#endif

namespace flashattn::sm90 {

// The (qk, v) head-dim variants with an sm90 forward, as two parallel lists (read by
// tools/generate_instantiations.py: keep the format). A call runs in the first variant that
// holds both of its head dims (multiples of 8; the columns past them load as zeros), so 32-64
// run as 64, 72-128 as 128; qk 136-192 with v <= 128 as 192 x 128.
inline constexpr int kFwdHeadDimsQK[] = {64, 128, 192, 192, 256};
inline constexpr int kFwdHeadDimsV[] = {64, 128, 128, 192, 256};
inline constexpr int kNumFwdVariants = sizeof(kFwdHeadDimsQK) / sizeof(int);
static_assert(sizeof(kFwdHeadDimsV) == sizeof(kFwdHeadDimsQK), "one v head dim per variant");

// The variant of a call's head dims, -1 when none holds them.
constexpr int fwd_variant(int d, int dv) {
  if (d % 8 != 0 || dv % 8 != 0 || d <= 0 || dv <= 0) return -1;
  for (int i = 0; i < kNumFwdVariants; ++i)
    if (d <= kFwdHeadDimsQK[i] && dv <= kFwdHeadDimsV[i]) return i;
  return -1;
}

// Consumer schedules (kernel_fwd_sm90.cuh): 1 intra-warpgroup overlap (the softmax of block
// j + 1 under P V of block j), 2 that and ping-pong between the consumer warpgroups.
enum FwdSchedule : int { kOverlap = 1, kPingPong = 2 };

// block_m query rows (block_m / 64 consumer warpgroups) x block_n keys per step, a K and a V
// ring of `stages` each, one producer warpgroup.
struct FwdTile {
  int block_m, block_n, stages, schedule;
  constexpr bool operator==(const FwdTile& o) const {
    return block_m == o.block_m && block_n == o.block_n && stages == o.stages &&
           schedule == o.schedule;
  }
};

#ifndef FLASHATTN_SM90_FWD_SCHEDULE  // d128's schedule; the self-test times both
#define FLASHATTN_SM90_FWD_SCHEDULE 2
#endif

// `local`: causal or a sliding window (the same tiles so far). Self-test A/B at 16k, TFLOP/s
// non-causal / causal (benchmarks/NOTES.md, 2026-12-01):
// d64: 192 x 128 ping-pong, three consumer warpgroups (160 registers each) 528 / 478; 128 x 128
//   443 / 415, 128 x 192 460 / 429, overlap only 491 / 426, 3 stages 516 / 461.
// d128: 128 x 128 ping-pong 643 / 431 (causal: persistent then), 128 x 176 (FA3's) 628 / 438,
//   overlap only 604 / 406; 3 stages no gain (earlier).
// d192: 128 x 112 (128 x 128 with v 128), FA3's shapes, untimed; d256: 128 x 80 overlap 773 /
//   467, ping-pong 726 / 408, 128 x 64 616 / 396 (80 is the shared-memory limit at 2 stages).
constexpr FwdTile fwd_tile(int d, int dv, bool /*local*/) {
  constexpr int st = FLASHATTN_SM90_FWD_STAGES;
  return d <= 64    ? FwdTile{192, 128, st, kPingPong}
         : d <= 128 ? FwdTile{128, 128, st, FLASHATTN_SM90_FWD_SCHEDULE}
         : d <= 192 ? FwdTile{128, dv <= 128 ? 128 : 112, st, kOverlap}
                    : FwdTile{128, 80, st, kOverlap};
}

// Non-causal and causal calls (no other window) without a score transform or dropout over at
// least kLongKeys keys take fwd_tile_long's tile where it has one (block_m 0: none). d128:
// 128 x 176 ping-pong (FA3's non-causal d128 tile); self-test, interleaved and cold
// (2026-12-02): +5% / +4% at 8k / 16k (636 vs 613 TFLOP/s at 16k), the same at 2k-4k,
// -2..-4% at <= 1k against 128 x 128. Causal (2026-12-04, both waiting for V late): 589 / 632
// against 575 / 603 at 8k / 16k (+2.5% / +4.7%), 528 / 525 at 4k, 440 / 466 at 2k (-6%).
inline constexpr int kLongKeys = 8192;
constexpr FwdTile fwd_tile_long(int d, int dv) {
  return d == 128 && dv == 128 ? FwdTile{128, 176, 2, kPingPong}  // 3 stages exceed the smem
                               : FwdTile{0, 0, 0, 0};
}

// Causal or windowed calls without a score transform or dropout over at most kShortLocalRows
// query rows take fwd_tile_short_local's tile where it has one (block_m 0: none), unless
// FLASHATTN_SM90_SHORT_LOCAL=0 (launch_fwd_sm90.cuh). d64: 128 x 128 ping-pong, whose query
// blocks split 512 / 1024 rows evenly where 192 leaves a third-full last block and the diagonal
// crosses more of the tile; self-test (2026-12-03, the rotated order), causal, TFLOP/s against
// 192 x 128: 184.6 / 177.2 at 512, 263.4 / 236.6 at 1k (+11%), 326.1 / 354.4 at 2k (-8%);
// non-causal 1k 361 / 388 (-7%). The package on the H200 (2026-12-04, e001a1e, bench_attn.py in
// two processes, =1 / =0): causal 512 195.0 / 177.3 (+10%), 1k 273.6 / 242.7 (+13%).
inline constexpr int kShortLocalRows = 1024;
constexpr FwdTile fwd_tile_short_local(int d, int dv) {
  return d <= 64 && dv <= 64 ? FwdTile{128, 128, FLASHATTN_SM90_FWD_STAGES, kPingPong}
                             : FwdTile{0, 0, 0, 0};
}

// Whether the steady-state step waits for V_j after issuing S_{j+1} = Q K_{j+1}^T (kVLate,
// kernel_fwd_sm90.cuh; FA3's and FA4's order) rather than before its turn. Self-test, cold,
// 2026-12-04 (TFLOP/s, late / early): d64 0..+2.6% at every N and causal (16k nc 529 / 521,
// 8k 525 / 511); d128 -0.4..+2.2% on 128 x 128 (16k nc 623 / 609), +1.6..+3.1% on the long
// tile from 4k up (16k nc 644 / 630), -3% at 2k there; d256 -2..-6% (16k nc 705 / 721): late
// at head dims up to 128 only (d192 untimed, left early as d256).
constexpr bool fwd_v_late(int d, int dv) { return d <= 128 && dv <= 128; }

// Shared memory of a tile but the output's staging area: Q, the K and V stages (each a
// 1024-aligned tile of 64-column chunks), 128 bytes of mbarriers, 1024 of alignment slack.
// eb: the bytes of an input element (2; the FP8 forward 1).
constexpr int fwd_ring_bytes(FwdTile t, int d, int dv, int eb = 2) {
  return t.block_m * d * eb + t.stages * t.block_n * (d + dv) * eb + 128 + 1024;
}

// The output's staging area for the TMA store of the epilogue (kernel_fwd_sm90.cuh, kTmaO):
// block_m x dv, where it fits beside the tile with 8 KB to spare for a block mask's lists
// (d64's 192 x 128 and 128 x 128, d128's 128 x 128); 0 elsewhere (the long-key 128 x 176,
// d192, d256: their epilogue stores from registers).
// (The output is 16-bit with FP8 inputs too.)
constexpr int fwd_o_stage_bytes(FwdTile t, int d, int dv, int eb = 2) {
  const int o = t.block_m * dv * 2;
  return fwd_ring_bytes(t, d, dv, eb) + o + 8192 <= 232448 ? o : 0;
}

// Shared memory of a tile: fwd_ring_bytes and the output's staging area (fwd_o_stage_bytes).
constexpr int fwd_smem_bytes(FwdTile t, int d, int dv, int eb = 2) {
  return fwd_ring_bytes(t, d, dv, eb) + fwd_o_stage_bytes(t, d, dv, eb);
}

// The FP8 (e4m3) forward's tiles (kernel_fwd_sm90.cuh's kFp8, issue 14): 128 keys a step (one
// 128-byte row of V^T per head-dim column, the K-major B of P V), the bf16 kernels' query
// blocks and schedules at d <= 128 (d64: three consumer warpgroups, one P buffer); d > 128 two
// warpgroups without ping-pong; dv 256 64 keys a step (64-byte V^T rows): at 128 its 128
// accumulator registers a thread spilled 28 / 72 bytes (plain / softcap), 28 / 268 with one P
// buffer. Written 2026-12-04 (third session) without a GPU: untimed starting points.
#ifndef FLASHATTN_SM90_FP8_D256_BN  // the d256 FP8 tile's keys a step (64 or 128)
#define FLASHATTN_SM90_FP8_D256_BN 64
#endif
constexpr FwdTile fwd_tile_fp8(int d, int dv) {
  return d <= 64    ? FwdTile{192, 128, 2, kPingPong}
         : d <= 128 ? FwdTile{128, 128, 2, kPingPong}
         : dv <= 192 ? FwdTile{128, 128, 2, kOverlap}
                     : FwdTile{128, FLASHATTN_SM90_FP8_D256_BN, 2, kOverlap};
}
// FP8 calls without softcap, non-causal or causal (no other window), over at least
// fwd_fp8_long_min_keys keys, with the staged V^T (not FLASHATTN_SM90_FP8_VCHIP), take
// fwd_tile_fp8_long's tile where it has one (block_m 0: none), unless FLASHATTN_SM90_FP8_LONG=0
// (launch_fwd_sm90.cuh).
// d128: 128 x 192 ping-pong from 8192 keys (the per-block costs, row maxima, O's rescale,
// barriers and waits, over 1.5x the keys; FA3 takes 224, past our shared memory with the
// on-chip V^T's ring). H100 A/B as a whole-build switch (ab_builds.sh, 2026-12-06,
// results/h100_fp8_ab_20261206b.txt), 192 / 128 keys: 16k 1.04 / 1.08 (non-causal / causal),
// 4k 0.98-1.00, 1k 0.89 / 0.84. ptxas: no spills (softcap's would spill 56 bytes: not built).
// At d64, 192 keys spilled 336 bytes (three consumers).
// d256: 128 x 128 without ping-pong from 2048 keys, where fwd_tile_fp8's 128 x 64 rescales
// O's 128 columns a thread for 32 exponentials a block. H100 A/B (fp8_d256_ab.sh, 2026-12-07,
// results/h100_fp8_d256_ab_834a95b.txt), against 128 x 64: non-causal 2k / 4k / 8k / 16k
// 1.04 / 1.10 / 1.09 / 1.12 (1013 TFLOP/s at 16k), causal 0.99 / 1.06 / 1.11 / 1.10, 1k 0.98 /
// 0.93 (hence the 2k rule); with ping-pong (FA3's d256 FP8 schedule) 0.92-1.13, below it at
// all but 8k non-causal. ptxas, plain kernel: 0 bytes of spills (ping-pong 4; softcap, which
// never takes it, 72). FLASHATTN_SM90_FP8_D256_LONG (a build's A/B): 0 none, 1 (the package)
// 128 x 128, 2 with ping-pong.
inline constexpr int kFp8LongKeys = 8192;
constexpr int fwd_fp8_long_min_keys(int d) { return d == 256 ? 2048 : kFp8LongKeys; }
#ifndef FLASHATTN_SM90_FP8_D256_LONG
#define FLASHATTN_SM90_FP8_D256_LONG 1
#endif
// d64 (FLASHATTN_SM90_FP8_D64_LONG=1, a build's A/B, default 0; written 2026-12-07, compiled
// only): 128 x 192 ping-pong (two consumer warpgroups) for the same calls from 8192 keys, in
// place of fwd_tile_fp8's 192 x 128 (three): a block's fixed costs over 1.5x the keys. ptxas:
// 0 bytes of spills. d64 FP8 is bound by the exponentials (MUFU ~1.5k cycles a block an SMSP
// against ~770 of tensor work), which no tile changes; this trims only the per-block costs.
#ifndef FLASHATTN_SM90_FP8_D64_LONG
#define FLASHATTN_SM90_FP8_D64_LONG 0
#endif
constexpr FwdTile fwd_tile_fp8_long(int d, int dv) {
  return d == 64 && dv == 64 && FLASHATTN_SM90_FP8_D64_LONG > 0
             ? FwdTile{128, 192, 2, kPingPong}
         : d == 128 && dv == 128 ? FwdTile{128, 192, 2, kPingPong}
         : d == 256 && dv == 256 && FLASHATTN_SM90_FP8_D256_LONG > 0
             ? FwdTile{128, 128, 2, FLASHATTN_SM90_FP8_D256_LONG == 2 ? kPingPong : kOverlap}
             : FwdTile{0, 0, 0, 0};
}
// d64 causal / windowed FP8 calls of at most kShortLocalRows query rows, without softcap, with
// the staged V^T, under FLASHATTN_SM90_FP8_SHORT=1 (opt-in, read per call; written 2026-12-07,
// seventh session, compiled only): 128 x 128 ping-pong (two consumer warpgroups), the bf16
// kernels' fwd_tile_short_local, in place of fwd_tile_fp8's 192 x 128, whose third-full last
// query block at 512 / 1k rows and longer diagonal cost the bf16 kernel 10-13% there (H200,
// 2026-12-04). FP8 / bf16 at d 64 causal 1k was 0.81 on an H100 (2026-12-07), the bf16 side
// with this tile. block_m 0: none.
constexpr FwdTile fwd_tile_fp8_short_local(int d, int dv) {
  return d == 64 && dv == 64 ? FwdTile{128, 128, 2, kPingPong} : FwdTile{0, 0, 0, 0};
}
// The widest key block an FP8 tile reads (fp8_layout_sm90.h sizes varlen's V^T regions by it).
constexpr int fwd_fp8_block_n_max() {
  int n = fwd_tile_fp8(192, 128).block_n;
  for (int d = 64; d <= 256; d += 64) {
    n = fwd_tile_fp8(d, d).block_n > n ? fwd_tile_fp8(d, d).block_n : n;
    n = fwd_tile_fp8_long(d, d).block_n > n ? fwd_tile_fp8_long(d, d).block_n : n;
    n = fwd_tile_fp8_short_local(d, d).block_n > n ? fwd_tile_fp8_short_local(d, d).block_n : n;
  }
  return n;
}

// Block-sparse calls (kernel_fwd_sm90.cuh's Is_sparse): a tile that divides 128 x 128 blocks,
// block_m 0 where the variant has none (the sm80 kernels run those). d64: 128 x 128 ping-pong
// (its dense 192-row tile does not divide 128-row blocks; the self-test's "128x128 pp" ran
// 0.82-0.95x that tile dense, 1.1-1.4x sm80, 2026-12-03); d128 and 192 x 128: their own
// 128 x 128; d256 (80 keys) and 192 x 192 (112): none yet.
constexpr FwdTile fwd_tile_sparse(int d, int dv, bool local) {
  const FwdTile t = d <= 64 && dv <= 64 ? FwdTile{128, 128, FLASHATTN_SM90_FWD_STAGES, kPingPong}
                                        : fwd_tile(d, dv, local);
  return 128 % t.block_m == 0 && 128 % t.block_n == 0 ? t : FwdTile{0, 0, 0, 0};
}

// Block-sparse calls add two lists of `cap` kernel key tiles (int), their counts and four
// mbarriers (kernel_fwd_sm90.cuh).
constexpr long long fwd_sparse_smem_bytes(long long cap) { return 64 + 8 * cap; }

}  // namespace flashattn::sm90
