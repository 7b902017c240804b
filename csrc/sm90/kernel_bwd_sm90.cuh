// The Hopper backward's main kernel (sm_90a), bf16 / fp16, head dims of the 64 or 128 bucket
// (kD): the package's backward there (dispatch_bwd_sm90.cu), also checked and timed by
// tools/selftest/selftest_bwd_sm80.cu built with -DSELFTEST_SM90. It slots between the sm80 backward's preprocessing (D = rowsum(dO * O)) and its
// conversions (dQ's fp32 accumulator to the output dtype, scaled; dK / dV of GQA), reusing
// their BwdArgs (sm80/kernel_bwd_aux_sm80.cuh).
//
// One CTA per kBN = 128 keys of a (head, sequence), looping over the visible blocks of kBM
// queries. Warpgroup 0: warp 0 loads K and V once and, through a kStages ring, each block's Q,
// dO (TMA), LSE (log2 units) and D; warp 1 adds each block's dQ into the fp32 accumulator (TMA
// reduce-add from shared memory). Consumer warpgroup c owns keys [64 c, 64 c + 64) and, with
// its keys as the M side, per query block:
//   S^T = K Q^T, dP^T = V dO^T          (A, B from shared memory; P^T's exp under dP^T's MMA)
//   P^T = exp2(S^T scale - lse), dS^T = P^T (dP^T - D)
//   dV += P^T dO, dK += dS^T Q          (A from registers)
//   dS^T to shared memory: the two consumers' halves are dS over all 128 keys, from which
//   consumer c computes its 64 x 64 block of the kBM x kD dQ (SS), handed to warp 1.
// So a query block's dQ is added once per CTA, and no math warp waits on a global reduction.
// dK, dV stay in registers to the end. benchmarks/NOTES.md ("sm90 backward") has the reasons.
#pragma once
#include <cuda.h>  // CUtensorMap (types only)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "../common/block_sparse_tiles.cuh"
#include "../common/dropout_lanes.cuh"
#include "../common/mask.h"
#include "../common/params.h"
#include "../common/seqlen.h"
#include "../sm80/kernel_bwd_aux_sm80.cuh"
#include "bwd_layout_sm90.h"
#include "bwd_order_sm90.cuh"  // bwd_block_coord
#include "primitives_bwd_sm90.cuh"

#ifndef FLASHATTN_SM90_DET_DEBUG  // bwd_dq_warp's bounded semaphore wait (a debugging build)
#define FLASHATTN_SM90_DET_DEBUG 0
#endif

namespace flashattn::sm90 {

#if FLASHATTN_SM90_DET_DEBUG
// A debugging build's bounded semaphore wait (-DFLASHATTN_SM90_DET_DEBUG=1; the opt-in
// deterministic switches hung once on an H100, 2026-12-07): false after ~2 s without the turn,
// where the caller names its place and goes on without it (wrong sums, but the kernel ends and
// its printf reaches the host). Its printf costs the kernel stack and spills: never in the
// package's build.
__device__ __forceinline__ bool det_debug_wait(const int* sem, int turn) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
    if (v == turn) return true;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > 2000000000ull) return false;
  }
}
#endif

struct BwdMaps {
  CUtensorMap q, k, v, dout;  // 4-D (d, row, head, batch) padded; 3-D (d, row, head) varlen
  CUtensorMap dq;             // the fp32 dQ accumulator, boxes of 32 columns x 64 rows
};

// kAblate (the self-test's variants; 0 in the package): 1 = warp 1 skips the dQ reduce-adds
// (the handshakes stay), pricing the global dQ traffic; 2 = P^T = min(S^T scale - lse, 1) (no
// exp2, no mask pass), pricing the softmax side's MUFU work (both timing only, never correct);
// 3 = the dQ staging without bwd_stage_dq's bank-conflict permutation, 4 = dV after dS^T at
// d128 too (FA3's order): both correct, for A/Bs.
template <int kD_, int kBM_, int kAblate_ = 0>
struct BwdConfig {
  static constexpr int kD = kD_, kBM = kBM_, kAblate = kAblate_;
  static constexpr int kBN = 128, kStages = 2, kConsumers = 2, kThreads = (kConsumers + 1) * 128;
  // FA3's Hopper tiles: d128 64 x 128 (S^T / dP^T m64n64 per consumer, dQ split by columns),
  // d64 128 x 128 (m64n128, dQ split by query rows): each consumer's dQ block is 64 x 64.
  static_assert((kD == 128 && kBM == 64) || (kD == 64 && kBM == 128),
                "d128 with 64-query blocks or d64 with 128-query blocks");
  static constexpr bool kDqByRows = kBM == 128;
  // dV's MMA issued before dP^T's wait, so the exps (which ptxas otherwise sinks past that
  // wait) run under dP^T's MMA and dV's under the dS^T math; at kBM = 128 the fp32 P^T, dP^T
  // and packed P^T together spill (48 bytes), so there dV follows dS^T.
  static constexpr bool kDvEarly = kBM == 64 && kAblate != 4;
  static_assert(kConsumers == 2, "two dQ blocks per query block, one per consumer");
  // Shared memory (byte offsets; all but the stats 1024-aligned): K, V (kBN x kD), the Q and
  // dO stages (kBM x kD), all in 64-column chunks of 128-byte swizzled rows; two dS^T buffers
  // (kBN keys x kBM queries, 64-query chunks); a dQ block per consumer (64 x 64 fp32 as two
  // 32-column chunks of 128-byte swizzled rows, the TMA reduce's box); per stage lse2, D.
  static constexpr int kKVChunk = kBN * 128, kQChunk = kBM * 128, kDSChunk = kBN * 128;
  static constexpr int kDQChunk = 64 * 128;
  static constexpr int kKBytes = kBN * kD * 2, kQBytes = kBM * kD * 2, kDSBytes = kBN * kBM * 2;
  static constexpr int kDQBytes = 2 * kDQChunk, kStatBytes = 2 * kBM * 4;
  static constexpr int kSmemK = 0, kSmemV = kKBytes, kSmemQ = 2 * kKBytes;
  static constexpr int kSmemDO = kSmemQ + kStages * kQBytes;
  static constexpr int kSmemDS = kSmemDO + kStages * kQBytes;
  static constexpr int kSmemDQ = kSmemDS + 2 * kDSBytes;
  static constexpr int kSmemStat = kSmemDQ + kConsumers * kDQBytes;
  static constexpr int kSmemBar = kSmemStat + kStages * kStatBytes;
  static constexpr int kSmem = kSmemBar + 128 + 1024;
  static_assert((1 + 2 * kStages) * 8 <= 128, "the mbarriers fit their 128 bytes");
  static_assert(kSmem <= 232448, "Hopper's opt-in shared memory per block (227 KB)");
  // Named barriers (0 is __syncthreads): both consumers' dS^T written; per consumer, its dQ
  // block written (consumer -> warp 1) and read by the reduce (warp 1 -> consumer).
  static constexpr int kBarDS = 1, kBarDQFull = 2, kBarDQEmpty = 2 + kConsumers;
  static constexpr int kBarDet = kBarDQEmpty + kConsumers;  // the consumers (bwd_dkv_turn_*)
  // Deterministic, two dQ warps (bwd_dq_warp): kBarDQHand and kBarDQHand + 1, one per receiving
  // warp (bwd_dq_hand_barrier).
  static constexpr int kBarDQHand = kBarDet + 1;
  static constexpr int kDQBarThreads = 128 + 32;
  // Consumer c's dQ block in the accumulator (bwd_dq_warp): kDQChunks boxes of 32 columns from
  // column dq_col(c), rows from the query block's row dq_row(c).
  static constexpr int kDQChunks = 2;
  static constexpr __device__ int dq_col(int c) { return kDqByRows ? 0 : 64 * c; }
  static constexpr __device__ int dq_row(int c) { return kDqByRows ? 64 * c : 0; }
};

// The package's tile per head dim (kD is the accumulators' row length).
template <int kD>
using BwdConfigFor = BwdConfig<kD, kD == 64 ? 128 : 64>;

// dK (scaled) and dV of this thread's keys kr[0], kr[1] and its kCols head-dim columns from
// col0 (col0 + j * 8 + (lane % 4) * 2 and + 1, j < kCols / 8; the accumulator layout of an
// m64nkCols MMA): written in Element (MHA) or added into the fp32 accumulators, rows of kD
// (GQA). Keys past the sequence and columns past the head dims are left alone.
template <typename Element, int kCols, int kD>
__device__ __forceinline__ void bwd_store_dk_dv(const sm80::BwdArgs& args, const SeqInfo& si,
                                                int b, int hk, const int (&kr)[2], int col0,
                                                int lane, const float (&dk)[kCols / 2],
                                                const float (&dv)[kCols / 2]) {
  const BwdParams& p = args.p;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (kr[r] >= si.seqlen_k) continue;
    const int64_t krow = si.k_row0 + kr[r];
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      const int col = col0 + j * 8 + (lane % 4) * 2;  // pairs: head dims are multiples of 8
      const float k0 = dk[j * 4 + 2 * r] * p.softmax_scale;
      const float k1 = dk[j * 4 + 2 * r + 1] * p.softmax_scale;
      const float v0 = dv[j * 4 + 2 * r], v1 = dv[j * 4 + 2 * r + 1];
      if (args.dk_accum == nullptr) {
        if (col < p.headdim)
          *reinterpret_cast<uint32_t*>(static_cast<Element*>(p.dk_ptr) + b * p.dk_batch_stride +
                                       krow * p.dk_row_stride + hk * p.dk_head_stride + col) =
              pack_x2<Element>(k0, k1);
        if (col < p.headdim_v)
          *reinterpret_cast<uint32_t*>(static_cast<Element*>(p.dv_ptr) + b * p.dv_batch_stride +
                                       krow * p.dv_row_stride + hk * p.dv_head_stride + col) =
              pack_x2<Element>(v0, v1);
      } else {
        const int64_t g = (sm80::bwd_detail::k_row_global(p, b, si) + kr[r]) * p.nheads_k + hk;
        if (col < p.headdim) {
          atomicAdd(args.dk_accum + g * kD + col, k0);
          atomicAdd(args.dk_accum + g * kD + col + 1, k1);
        }
        if (col < p.headdim_v) {
          atomicAdd(args.dv_accum + g * kD + col, v0);
          atomicAdd(args.dv_accum + g * kD + col + 1, v1);
        }
      }
    }
  }
}

// The producer's load warp (warp 0 of warpgroup 0; Cfg: BwdConfig or BwdConfigD256): K and V
// of the key block once; per iteration the query block m_block(it)'s Q and dO (TMA, lane 0)
// into stage it % kStages once its last use is read, and its stats (lse in log2 units, D; rows
// past the sequence: lse +inf, so P = 0 without a mask, and D 0) by all 32 lanes, released
// with the stage's mbarrier.
template <class Cfg, class MBlock>
__device__ __forceinline__ void bwd_load_warp(const BwdParams& p, const BwdMaps& maps,
                                              uint8_t* smem, uint32_t smem0, uint64_t* kv_full,
                                              uint64_t* q_full, uint64_t* q_empty,
                                              const SeqInfo& si, int b, int h, int hk, int n0,
                                              int n_iters, int lane, MBlock m_block) {
  constexpr int kD = Cfg::kD, kBM = Cfg::kBM, kStages = Cfg::kStages;
  const int tb = p.is_varlen ? 0 : b;  // TMA rows: q_row0 / k_row0 + r
  auto load = [&](uint8_t* dst, const CUtensorMap* map, uint64_t* bar, int col, int64_t row,
                  int head) {
    if (p.is_varlen) tma_load_3d(dst, map, bar, col, int(row), head);
    else tma_load_4d(dst, map, bar, col, int(row), head, tb);
  };
  if (lane == 0) {
    mbar_arrive_expect_tx(kv_full, 2 * Cfg::kKBytes);
#pragma unroll
    for (int ch = 0; ch < kD / 64; ++ch) {
      load(smem + Cfg::kSmemK + ch * Cfg::kKVChunk, &maps.k, kv_full, ch * 64, si.k_row0 + n0,
           hk);
      load(smem + Cfg::kSmemV + ch * Cfg::kKVChunk, &maps.v, kv_full, ch * 64, si.k_row0 + n0,
           hk);
    }
  }
  const float* lse = p.lse_ptr + b * p.lse_batch_stride + h * p.lse_head_stride + si.q_row0;
  const float* dsum = p.dsoftmax_sum + b * p.lse_batch_stride + h * p.lse_head_stride + si.q_row0;
#pragma unroll 1
  for (int it = 0; it < n_iters; ++it) {
    const int stage = it % kStages, use = it / kStages, m0 = m_block(it) * kBM;
    // The block's stats, loaded before the wait so the latency hides under it.
    float l2[kBM / 32], dd[kBM / 32];
#pragma unroll
    for (int r = 0; r < kBM / 32; ++r) {
      const int i = m0 + r * 32 + lane;
      l2[r] = INFINITY;
      dd[r] = 0.f;
      if (i < si.seqlen_q) {
        l2[r] = lse[i] * 1.4426950408889634f;
        dd[r] = dsum[i];
      }
    }
    if (use > 0) mbar_wait(q_empty + stage, (use - 1) & 1);
    if (lane == 0) {
      const int64_t row = si.q_row0 + m0;
      mbar_arrive_expect_tx(q_full + stage, 2 * Cfg::kQBytes);
#pragma unroll
      for (int ch = 0; ch < kD / 64; ++ch) {
        load(smem + Cfg::kSmemQ + stage * Cfg::kQBytes + ch * Cfg::kQChunk, &maps.q,
             q_full + stage, ch * 64, row, h);
        load(smem + Cfg::kSmemDO + stage * Cfg::kQBytes + ch * Cfg::kQChunk, &maps.dout,
             q_full + stage, ch * 64, row, h);
      }
    }
    const uint32_t stat = smem0 + Cfg::kSmemStat + stage * Cfg::kStatBytes;
#pragma unroll
    for (int r = 0; r < kBM / 32; ++r) {
      sts_f32(stat + (r * 32 + lane) * 4, l2[r]);
      sts_f32(stat + (kBM + r * 32 + lane) * 4, dd[r]);
    }
    mbar_arrive(q_full + stage);  // release: the stats stores above come with it
  }
}

// The producer's dQ warp (warp 1 of warpgroup 0): per iteration each consumer's dQ block,
// once it is written (kBarDQFull + c), added into the fp32 accumulator with TMA reduce-adds
// (Cfg::dq_col / dq_row: where it lands), its area handed back (kBarDQEmpty + c) once read;
// the adds complete before the CTA ends. kAblate 1 (timing only) skips the adds.
// kDet (deterministic=True): a query block's adds go in a fixed key-block order: this CTA
// (key block n_block) waits until the block's semaphore counts the key blocks before it in
// that order (bwd_det_turn, bwd_layout_sm90.h: the diagonal order for causal masks, else
// index order), adds, waits for the adds to complete and counts itself (sm80's sem_wait /
// sem_release). Each waits only on key blocks dispatched before it (bwd_block_coord,
// bwd_m_block's visiting order), so the waits end.
// Deterministic calls with BwdArgs::det_dq_warps 2 (the default; FLASHATTN_SM90_DET_DQ2=0: one
// warp): warps 1 and 2 take the iterations in turn (first, first + 2, ...), handing the dQ stages
// over in order through one named barrier per receiving warp (bwd_dq_hand_barrier; a single shared
// one could pair a warp with itself: found in review after a test of these switches hung on an
// H100, 2026-12-07; the host check simulates both), and each hands a stage back once read, then
// waits for its adds to complete and counts itself, while the other warp takes the next block: the
// completion's latency (an L2 round trip under every SM's reduce traffic) leaves the consumers'
// path.
template <class Cfg, bool kDet = false, class MBlock>
__device__ __forceinline__ void bwd_dq_warp(const sm80::BwdArgs& args, const BwdMaps& maps,
                                            uint32_t smem0, const SeqInfo& si, const MaskInfo& mi,
                                            int b, int h, int n_block, int n_iters, int lane,
                                            MBlock m_block, int first = 0, int stride = 1) {
  const BwdParams& p = args.p;
  const int tb = p.is_varlen ? 0 : b;
  if constexpr (!kDet) first = 0, stride = 1;
  // The stages back to the consumers, each once the reduce has read it (before their next block).
  auto hand_back = [&] {
    if (lane == 0) bulk_wait_read<1>();
    __syncwarp();
    named_bar_arrive(Cfg::kBarDQEmpty + 0, Cfg::kDQBarThreads);
    if (lane == 0) bulk_wait_read<0>();
    __syncwarp();
    named_bar_arrive(Cfg::kBarDQEmpty + 1, Cfg::kDQBarThreads);
  };
  // Deterministic: the adds complete (written, not only read), then this key block's turn ends.
  auto end_turn = [&](int* sem) {
    if (lane == 0) {
      bulk_wait<0>();
      fence_proxy_async_global();
      sm80::bwd_detail::sem_release(sem);
    }
  };
  for (int it = first; it < n_iters; it += stride) {
    const int m0 = m_block(it) * Cfg::kBM;
    int* sem = nullptr;
    if constexpr (kDet) {
      sem = args.dq_sem + (int64_t(b) * p.nheads + h) * args.m_blocks + m_block(it);
      if (lane == 0) {
        const int turn = bwd_det_turn(mi, m0, n_block, Cfg::kBM, Cfg::kBN, args.det_diag);
#if FLASHATTN_SM90_DET_DEBUG
        if (!det_debug_wait(sem, turn))
          printf("flashattn sm90 det bwd: dQ turn not reached: b %d h %d key block %d query "
                 "block %d turn %d semaphore %d (diag %d, dq warps %d, step %d of %d)\n", b, h,
                 n_block, m0 / Cfg::kBM, turn, *(volatile int*)sem, int(args.det_diag), stride,
                 it, n_iters);
#else
        sm80::bwd_detail::sem_wait(sem, turn);
#endif
        fence_proxy_async_global();  // the reduce-adds (async proxy) after the acquire
      }
      if (stride == 2 && it > 0) {  // the other warp has taken block it - 1's stages
        __syncwarp();
        named_bar_sync(Cfg::kBarDQHand + bwd_dq_hand_barrier(it), 64);
      }
    }
#pragma unroll
    for (int c = 0; c < Cfg::kConsumers; ++c) {
      __syncwarp();  // bar.sync is warp-aligned: lane 0 was alone just before
      named_bar_sync(Cfg::kBarDQFull + c, Cfg::kDQBarThreads);
      if (lane == 0) {
        const uint32_t src = smem0 + Cfg::kSmemDQ + c * Cfg::kDQBytes;
        const int col = Cfg::dq_col(c), row = int(si.q_row0) + m0 + Cfg::dq_row(c);
        if constexpr (Cfg::kAblate != 1) {
#pragma unroll
          for (int k = 0; k < Cfg::kDQChunks; ++k) {
            if (p.is_varlen)
              tma_reduce_add_3d(&maps.dq, src + k * Cfg::kDQChunk, col + 32 * k, row, h);
            else
              tma_reduce_add_4d(&maps.dq, src + k * Cfg::kDQChunk, col + 32 * k, row, h, tb);
          }
        }
        bulk_commit();
      }
    }
    if constexpr (kDet) {
      if (stride == 2) {  // the next block to the other warp, the stages back, then the turn
        if (it + 1 < n_iters) {
          __syncwarp();
          named_bar_arrive(Cfg::kBarDQHand + bwd_dq_hand_barrier(it + 1), 64);
          hand_back();
        }
        end_turn(sem);
        continue;
      }
      end_turn(sem);
    }
    if (it + 1 < n_iters) hand_back();
  }
  if (lane == 0) bulk_wait<0>();  // the reduce-adds complete before the CTA ends
}

// A consumer's dQ block (an m64nkCols fp32 accumulator) into the reduce's staging layout,
// kChunk bytes a 32-column chunk, in bwd_layout_sm90.h's bank-conflict-free order
// (dq_stage_slot; kSwap false: the plain order, the self-test's A/B, BwdConfig kAblate 3).
template <int kCols, int kChunk, bool kSwap = true>
__device__ __forceinline__ void bwd_stage_dq(uint32_t dq_smem, const float (&dq)[kCols / 2],
                                             int warp, int lane) {
  // dq_stage_slot's swapped lanes (its block is j ^ 2 there), tested once: per-step compares
  // of slot.block cost 32 more instructions.
  const bool odd = kSwap && ((lane / 4) & 1);
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const DqStageSlot slot = dq_stage_slot(j, r, warp, lane, kChunk, kSwap);
      // The pair of block slot.block from static registers: selects, not indexing.
      sts_f32x2(dq_smem + slot.offset, odd ? dq[(j ^ 2) * 4 + 2 * r] : dq[j * 4 + 2 * r],
                odd ? dq[(j ^ 2) * 4 + 2 * r + 1] : dq[j * 4 + 2 * r + 1]);
    }
}

// Has_dropout (params.h): which elements of an m64nkN S^T accumulator (this warp's 16 keys,
// 16-key block J; the kN queries from 16-query block I0) the forward kept, one bit each (bit i
// of zbits[i / 32]). Element i = j * 4 + e: query column j * 8 + (lane % 4) * 2 + (e & 1)
// (the half j % 2 of 16-query block j / 2), key row lane / 4 + 8 (e >> 1): byte 2 (j % 2) +
// (e >> 1) of the block's keep word e & 1 (dropout_words_st, two blocks per draw; kCells: its
// cell-by-cell path).
template <int kN, bool kCells>
__device__ __forceinline__ void bwd_keep_bits_st(const DropoutRng& rng, int I0, int J, int lane,
                                                 uint32_t (&zbits)[(kN / 2 + 31) / 32]) {
  static_assert(kN % 32 == 0, "16-query blocks in pairs");
#pragma unroll
  for (int w = 0; w < (kN / 2 + 31) / 32; ++w) zbits[w] = 0u;
#pragma unroll
  for (int cp = 0; cp < kN / 16; cp += 2) {
    uint32_t wa[2], wb[2];
    dropout_words_st<kCells>(rng, I0 + cp, J, I0 + cp + 1, J, lane, wa, wb);
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {
      const uint32_t kept[2] = {dropout_kept4(rng, blk ? wb[0] : wa[0]),
                                dropout_kept4(rng, blk ? wb[1] : wa[1])};
#pragma unroll
      for (int ch = 0; ch < 2; ++ch)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = (2 * (cp + blk) + ch) * 4 + e;
          zbits[i / 32] |= ((kept[e & 1] >> (8 * (2 * ch + (e >> 1)))) & 1u) << (i % 32);
        }
    }
  }
}

// Deterministic mode under GQA: one key block's dK / dV adds from the group's query heads go
// in head order. The consumers (thread 128 waits, all of them at a named barrier) wait until
// the block's semaphore counts the heads before this one, add, then count this head once every
// consumer thread's adds are done (a fence each, the barrier, one release). Lower heads of a
// key block are dispatched before it (bwd_block_coord's orders), so the waits end.
template <class Cfg>
__device__ __forceinline__ int* bwd_dkv_turn_wait(const sm80::BwdArgs& args, int b, int h,
                                                  int hk, int n_block) {
  int* sem = args.dkv_sem + (int64_t(b) * args.p.nheads_k + hk) * gridDim.x + n_block;
#if FLASHATTN_SM90_DET_DEBUG
  if (threadIdx.x == 128 && !det_debug_wait(sem, h % args.group))
    printf("flashattn sm90 det bwd: dK / dV turn not reached: b %d h %d key block %d turn %d "
           "semaphore %d\n", b, h, n_block, h % args.group, *(volatile int*)sem);
#else
  if (threadIdx.x == 128) sm80::bwd_detail::sem_wait(sem, h % args.group);
#endif
  named_bar_sync(Cfg::kBarDet, Cfg::kConsumers * 128);
  return sem;
}
template <class Cfg>
__device__ __forceinline__ void bwd_dkv_turn_end(int* sem) {
  __threadfence();
  named_bar_sync(Cfg::kBarDet, Cfg::kConsumers * 128);
  if (threadIdx.x == 128) sm80::bwd_detail::sem_release(sem);
}

// The query block of iteration it (the sm90 backward kernels): m_lo + it, from the last down in
// deterministic mode without the diagonal order (bwd_layout_sm90.h), or the block-sparse
// list's entry.
template <bool kDet, bool kSparse>
__device__ __forceinline__ int bwd_m_block(int it, int m_lo, int n_iters, const int* list,
                                           bool det_diag) {
  if constexpr (kSparse) return list[1 + it];
  return bwd_visit_block(it, m_lo, n_iters, kDet && !det_diag);
}

// The score transform of the backward (Has_score_mod: softcap and / or ALiBi, as the sm80
// backward computes them, tanh.approx): on S^T in log2 units, cap * tanh(S scale / cap) (its
// derivative's factor 1 - tanh^2 kept for dS) minus the ALiBi slope times |i + shift - j|.
struct BwdScoreMod {
  bool has_cap;
  float scale_over_cap, cap_log2, slope_log2;
  int shift;  // i + shift - j: the key's distance from the query's diagonal (MaskInfo::shift)
};
__device__ __forceinline__ BwdScoreMod bwd_score_mod(const BwdParams& p, int b, int h,
                                                     const MaskInfo& mi) {
  constexpr float kLog2e = 1.4426950408889634f;
  const bool has_cap = p.softcap > 0.f;
  return BwdScoreMod{has_cap, has_cap ? p.softmax_scale / p.softcap : 0.f, p.softcap * kLog2e,
                     alibi_slope(p, b, h) * kLog2e, mi.shift()};
}

// P^T = exp2(score(S^T) - lse2) in place on an m64nkN accumulator: element j * 4 + e is query
// q0 + j * 8 + (lane % 4) * 2 + (e & 1) (its lse2 at lse_addr + 4 (j * 8 + (lane % 4) * 2 +
// (e & 1))), key kr[e >> 1]. score: S^T scale_log2, or with Has_score_mod the transform above
// (dth, kT = kN / 4: 1 - tanh^2 per element, fp16 pairs (e, e + 1); unused otherwise).
// masked: elements outside [qb, qe) of their key are -inf first. kExp false (a timing
// ablation): min(x, 1), no exp2, no mask.
template <int kN, bool Has_score_mod, bool kExp = true, int kT>
__device__ __forceinline__ void bwd_probs_st(float (&st)[kN / 2], __half2 (&dth)[kT],
                                             uint32_t lse_addr, int q0, int lane,
                                             const int (&kr)[2], const int (&qb)[2],
                                             const int (&qe)[2], bool masked, float scale_log2,
                                             const BwdScoreMod& sm) {
  static_assert(!Has_score_mod || kT == kN / 4, "a factor per element");
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    const float2 l = lds_f32x2(lse_addr + (j * 8 + (lane % 4) * 2) * 4);
    if constexpr (Has_score_mod) {
      float g[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float& x = st[j * 4 + e];
        g[e] = 1.f;
        if (sm.has_cap) {
          const float t = sm80::bwd_detail::fast_tanh(x * sm.scale_over_cap);
          x = t * sm.cap_log2;
          g[e] = 1.f - t * t;
        } else {
          x *= scale_log2;
        }
        const int dist = q0 + j * 8 + (lane % 4) * 2 + (e & 1) + sm.shift - kr[e >> 1];
        x -= sm.slope_log2 * static_cast<float>(dist < 0 ? -dist : dist);
        x -= (e & 1) ? l.y : l.x;
      }
      dth[j * 2] = __floats2half2_rn(g[0], g[1]);
      dth[j * 2 + 1] = __floats2half2_rn(g[2], g[3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st[j * 4 + e] = fmaf(st[j * 4 + e], scale_log2, (e & 1) ? -l.y : -l.x);
    }
  }
  if (masked && kExp) {  // -inf, never exp2(+inf): no visible key, lse -inf
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, i = q0 + j * 8 + (lane % 4) * 2 + (e & 1);
        if (!(i >= qb[r] && i < qe[r])) st[j * 4 + e] = -INFINITY;
      }
  }
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) st[i] = kExp ? exp2_ftz(st[i]) : fminf(st[i], 1.f);
}

// dS^T = P^T (dP^T z - D) [* (1 - tanh^2)] in place on dpt (bwd_probs_st's elements; D at
// d_addr as the lse there; z(i): element i's dropout factor, 1 without dropout).
template <int kN, bool Has_score_mod, int kT, class Z>
__device__ __forceinline__ void bwd_dscores_st(float (&dpt)[kN / 2], const float (&st)[kN / 2],
                                               const __half2 (&dth)[kT], uint32_t d_addr,
                                               int lane, bool has_cap, Z z) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    const float2 d = lds_f32x2(d_addr + (j * 8 + (lane % 4) * 2) * 4);
    float2 g[2] = {make_float2(1.f, 1.f), make_float2(1.f, 1.f)};
    if constexpr (Has_score_mod) {
      if (has_cap) g[0] = __half22float2(dth[j * 2]), g[1] = __half22float2(dth[j * 2 + 1]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = j * 4 + e;
      const float ds = st[i] * (dpt[i] * z(i) - ((e & 1) ? d.y : d.x));
      dpt[i] = Has_score_mod ? ds * ((e & 1) ? g[e >> 1].y : g[e >> 1].x) : ds;
    }
  }
}

// Has_dropout (params.h): the forward's keep mask Z regenerated per block (dropout_lanes.cuh,
// the S^T orientation): dV takes P^T Z scale, dS^T = P^T (Z scale dP^T - D), as the sm80
// backward computes them.
// Is_sparse (params.h's q_num_blocks / q_indices, padded batches, block_m a multiple of kBM
// and block_n of kBN; list_cap > 0): before the roles split, warp 0 lists the key block's
// kernel query blocks (its mask key block's kept query blocks, split into kBM tiles, that
// meet the queries seeing it; block_sparse_tiles.cuh) in shared memory past the tiles, and
// every role walks that list where it walks the query blocks up otherwise; a key block with
// an empty list writes dK = dV = 0.
// Has_score_mod: softcap and / or ALiBi (bwd_score_mod; calls without dropout or a block mask).
// Is_det: deterministic=True (bwd_dq_warp's and bwd_dkv_turn_*'s orders; plain calls only).
template <class Cfg, typename Element, bool Has_dropout, bool Is_sparse, bool Has_score_mod,
          bool Is_det, bool kCells>
__device__ __forceinline__ void bwd_body_sm90(const sm80::BwdArgs& args, const BwdMaps& maps,
                                              int sect, int list_cap) {
  constexpr int kD = Cfg::kD, kBM = Cfg::kBM, kBN = Cfg::kBN, kStages = Cfg::kStages;
  // setmaxnreg below moves registers within the CTA's pool (kThreads x 168 at 384 threads).
  static_assert(24 + Cfg::kConsumers * 240 <=
                    (Cfg::kConsumers + 1) * ((65536 / Cfg::kThreads) & ~7),
                "the roles' registers fit the CTA's pool");
  const BwdParams& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  // Offsets from the __shared__ array itself keep the shared address space (STS, not ST.E).
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem0 = smem_u32(smem);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Cfg::kSmemBar);
  uint64_t* q_full = kv_full + 1;
  uint64_t* q_empty = q_full + kStages;
  int n_block, h, b;
  const bool det_diag = Is_det && args.det_diag;  // the host's choice (launch_bwd_sm90.cuh)
  bwd_block_coord<Is_det>(sect, n_block, h, b, Is_sparse ? args.order : nullptr, det_diag);
  const int hk = h / args.group;
  const SeqInfo si = sm80::bwd_detail::seq_info_clamped(p, b);
  const int n0 = n_block * kBN;
  if (n0 >= si.seqlen_k) return;  // varlen: past this sequence (the whole CTA leaves)
  const MaskInfo mi{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right,
                    pos_shift_of(p, b)};
  // The query blocks with a query that sees some key of the block (bwd_layout_sm90.h).
  const QueryBlockRange qr = bwd_query_blocks(mi, n_block, kBM, kBN);
  const int m_lo = qr.m_lo;
  int n_iters = qr.count;
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);  // warp-uniform
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  if (threadIdx.x == 0) {
    mbar_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(q_full + s, 1 + 32);  // warp 0: lane 0's expect-tx, then every lane's stats
      mbar_init(q_empty + s, Cfg::kConsumers * 128);
    }
    mbar_init_fence();
  }
  // Block-sparse: the list (and its count) past the mbarriers, built before the roles split.
  int* list = reinterpret_cast<int*>(smem + Cfg::kSmemBar + 128);
  if constexpr (Is_sparse) {
    if (threadIdx.x < 32) {
      const SparseAxes axes{p.q_num_blocks, p.q_indices,
                            b * p.bs_t_batch_stride + h * p.bs_t_head_stride,
                            p.n_kblocks, p.n_qblocks, p.block_n, p.block_m};
      const int cnt = build_sparse_tiles<kBN, kBM>(axes, n0, si.seqlen_k, m_lo, m_lo + n_iters,
                                                   list + 1, nullptr, list_cap, lane);
      if (lane == 0) list[0] = min(cnt, list_cap);
    }
    __syncthreads();
    n_iters = list[0];
  } else {
    __syncthreads();
  }
  // The query block of iteration it.
  auto m_block = [&](int it) {
    return bwd_m_block<Is_det, Is_sparse>(it, m_lo, n_iters, list, det_diag);
  };

  if (wg == 0) {
    setmaxnreg_dec<24>();  // 24 + 2 x 240 = 3 x 168, the CTA's pool (more: the increase hangs)
    // (Deterministic calls: warps 1 and 2 take the dQ blocks in turn under det_dq_warps 2.)
    const int dq_warps = Is_det ? args.det_dq_warps : 1;
    if (n_iters == 0 || warp > dq_warps) return;
    if (warp == 0)
      bwd_load_warp<Cfg>(p, maps, smem, smem0, kv_full, q_full, q_empty, si, b, h, hk, n0,
                         n_iters, lane, m_block);
    else
      bwd_dq_warp<Cfg, Is_det>(args, maps, smem0, si, mi, b, h, n_block, n_iters, lane,
                               m_block, warp - 1, dq_warps);
    return;
  }

  setmaxnreg_inc<240>();
  const int c = wg - 1;
  // This thread's keys (the accumulators' rows): kr[0], kr[1] = kr[0] + 8, and the queries
  // that see each, [qb, qe) (empty for keys past the sequence).
  int kr[2], qb[2], qe[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    kr[r] = n0 + c * 64 + warp * 16 + lane / 4 + 8 * r;
    const bool in = kr[r] < si.seqlen_k;
    qb[r] = in ? mi.query_begin(kr[r]) : 0;
    qe[r] = in ? mi.query_end(kr[r]) : 0;
  }
  // A query block needs the element mask unless all its queries see all 128 keys (then the
  // block's keys are inside the sequence; its rows past the sequence get P = 0 from lse).
  const bool keys_in = n0 + kBN <= si.seqlen_k;
  const int full_lo = keys_in ? mi.query_begin(n0 + kBN - 1) : 0;
  const int full_hi = keys_in ? mi.query_end(n0) : 0;
  const float scale_log2 = p.softmax_scale_log2;
  const BwdScoreMod smod = Has_score_mod ? bwd_score_mod(p, b, h, mi) : BwdScoreMod{};
  DropoutRng rng{};
  if constexpr (Has_dropout)
    rng = dropout_rng(p.rng_state, p.dropout_threshold, b, h, q_pos_of(p, b), k_pos_of(p, b));
  float dk[kD / 2], dv[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint32_t k_smem = smem0 + Cfg::kSmemK;
  const uint32_t k_keys = k_smem + c * 64 * 128;  // this warpgroup's 64 keys (K, V rows)
  const uint32_t v_keys = smem0 + Cfg::kSmemV + c * 64 * 128;
  const uint32_t dq_smem = smem0 + Cfg::kSmemDQ + c * Cfg::kDQBytes;
  // dQ block c: A = dS (64 queries of the chunk x 128 keys, M-major), B = K (128 keys x 64
  // columns of the chunk, N-major).
  const uint32_t ds_chunk = (Cfg::kDqByRows ? c : 0) * Cfg::kDSChunk;
  const uint64_t dq_b_desc =
      gmma_desc_sw128(k_smem + (Cfg::kDqByRows ? 0 : c) * Cfg::kKVChunk, Cfg::kKVChunk, 1024);
  const uint64_t k_desc = gmma_desc_sw128(k_keys, 16, 1024);
  const uint64_t v_desc = gmma_desc_sw128(v_keys, 16, 1024);

  if (n_iters > 0) mbar_wait(kv_full, 0);
  for (int it = 0; it < n_iters; ++it) {
    const int stage = it % kStages, m0 = m_block(it) * kBM;
    const uint32_t q_base = smem0 + Cfg::kSmemQ + stage * Cfg::kQBytes;
    const uint32_t do_base = smem0 + Cfg::kSmemDO + stage * Cfg::kQBytes;
    const uint32_t stat = smem0 + Cfg::kSmemStat + stage * Cfg::kStatBytes;
    const uint32_t ds_base = smem0 + Cfg::kSmemDS + (it & 1) * Cfg::kDSBytes;
    const bool masked = !keys_in || m0 < full_lo || min(m0 + kBM, si.seqlen_q) > full_hi;
    // Dropout: which of this thread's kBM / 2 elements the forward kept (bwd_keep_bits_st),
    // drawn before this block's MMAs hold their accumulators (under them the Philox rounds
    // spilled ~100 bytes) and held to dS^T.
    uint32_t zbits[(kBM / 2 + 31) / 32];
    if constexpr (Has_dropout)
      bwd_keep_bits_st<kBM, kCells>(rng, m0 >> 4, (n0 + c * 64 + warp * 16) >> 4, lane, zbits);
    auto z = [&](int i) {  // element i's dropout factor (1 without dropout)
      if constexpr (Has_dropout) return (zbits[i / 32] >> (i % 32)) & 1u ? p.dropout_scale : 0.f;
      return 1.f;
    };
    mbar_wait(q_full + stage, (it / kStages) & 1);
    float st[kBM / 2], dpt[kBM / 2];
    // acc = A B^T over kD, both K-major: A this warpgroup's 64 keys, B the kBM queries.
    auto mma_keys_queries = [&](float (&acc)[kBM / 2], uint64_t a_desc, uint32_t b_base) {
      const uint64_t b_desc = gmma_desc_sw128(b_base, 16, 1024);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t in_row = (kk % 4) * 32;  // 16 columns of a 128-byte row
        wgmma_ss<false, Element>(acc, desc_add(a_desc, (kk / 4) * Cfg::kKVChunk + in_row),
                                 desc_add(b_desc, (kk / 4) * Cfg::kQChunk + in_row), kk > 0);
      }
    };
    wgmma_fence();
    mma_keys_queries(st, k_desc, q_base);  // S^T = K Q^T
    wgmma_commit();
    mma_keys_queries(dpt, v_desc, do_base);  // dP^T = V dO^T
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_operands(st);
    // P^T = exp2(score(S^T) - lse2), this thread's query columns j * 8 + (lane % 4) * 2 + e.
    __half2 dth[Has_score_mod ? kBM / 4 : 1];
    bwd_probs_st<kBM, Has_score_mod, Cfg::kAblate != 2>(st, dth, stat, m0, lane, kr, qb, qe,
                                                        masked, scale_log2, smod);
    uint32_t ap[kBM / 16][4], ads[kBM / 16][4];  // P^T, dS^T packed as A operands (K = queries)
    const uint64_t do_desc = gmma_desc_sw128(do_base, Cfg::kQChunk, 1024);
    auto mma_dv = [&] {  // dV += P^T dO
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int i = 8 * kk + 2 * q;
          ap[kk][q] = pack_x2<Element>(st[i] * z(i), st[i + 1] * z(i + 1));  // P^T Z scale
        }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk)  // 16 queries = 16 rows of 128 bytes
        wgmma_rs<true, Element>(dv, ap[kk], desc_add(do_desc, kk * 16 * 128), 1);
      wgmma_commit();
    };
    if constexpr (Cfg::kDvEarly) {
      mma_dv();
      wgmma_wait<1>();  // dP^T done; dV may still run
    } else {
      wgmma_wait<0>();
    }
    wgmma_fence_operands(dpt);
    bwd_dscores_st<kBM, Has_score_mod>(dpt, st, dth, stat + kBM * 4, lane, smod.has_cap, z);
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        ads[kk][q] = pack_x2<Element>(dpt[8 * kk + 2 * q], dpt[8 * kk + 2 * q + 1]);
    if constexpr (!Cfg::kDvEarly) mma_dv();
    // dS^T into shared memory: row = key (of 128), 64-query chunks of 128-byte rows swizzled
    // (16-byte unit XOR row % 8, row % 8 = lane / 4): the M-major A of dQ = dS K.
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = c * 64 + warp * 16 + lane / 4 + 8 * r;
        const uint32_t off = (j / 8) * Cfg::kDSChunk + row * 128 +
                             (((j % 8) ^ (lane / 4)) * 16) + (lane % 4) * 4;
        sts_u32(ds_base + off, ads[j / 2][(j % 2) * 2 + r]);  // = dS^T (row, j * 8 + ...)
      }
    fence_async_shared();
    // Both consumers' dS^T are written. Also orders the buffer's reuse two blocks on: each
    // consumer's dQ MMAs of block it - 2 completed before it reached this barrier at it - 1.
    named_bar_sync(Cfg::kBarDS, Cfg::kConsumers * 128);
    float dq[32];
    wgmma_fence();  // ads was written since the last fence
    const uint64_t dq_a_desc = gmma_desc_sw128(ds_base + ds_chunk, Cfg::kDSChunk, 1024);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)  // K = the 128 keys, 16 rows of 128 bytes a step
      wgmma_ss<true, Element, true>(dq, desc_add(dq_a_desc, kk * 16 * 128),
                                    desc_add(dq_b_desc, kk * 16 * 128), kk > 0);
    wgmma_commit();
    const uint64_t q_desc = gmma_desc_sw128(q_base, Cfg::kQChunk, 1024);
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      wgmma_rs<true, Element>(dk, ads[kk], desc_add(q_desc, kk * 16 * 128), 1);
    wgmma_commit();
    wgmma_wait<1>();  // dV and dQ done; dK may still run
    wgmma_fence_operands(dq);
    if (it > 0) named_bar_sync(Cfg::kBarDQEmpty + c, Cfg::kDQBarThreads);  // last block read
    bwd_stage_dq<64, Cfg::kDQChunk, Cfg::kAblate != 3>(dq_smem, dq, warp, lane);  // for warp 1
    fence_async_shared();
    named_bar_arrive(Cfg::kBarDQFull + c, Cfg::kDQBarThreads);
    wgmma_wait<0>();
    wgmma_fence_operands(dk);
    wgmma_fence_operands(dv);
    mbar_arrive(q_empty + stage);  // Q, dO and the stats of this stage are read
  }

  // dK (scaled) and dV (nothing to add from a key block that saw no query block under GQA).
  if constexpr (Is_det) {
    if (args.dk_accum != nullptr) {  // GQA: in head order, a turn taken even with nothing to add
      int* sem = bwd_dkv_turn_wait<Cfg>(args, b, h, hk, n_block);
      if (n_iters > 0) bwd_store_dk_dv<Element, kD, kD>(args, si, b, hk, kr, 0, lane, dk, dv);
      bwd_dkv_turn_end<Cfg>(sem);
      return;
    }
  }
  if (args.dk_accum != nullptr && n_iters == 0) return;
  bwd_store_dk_dv<Element, kD, kD>(args, si, b, hk, kr, 0, lane, dk, dv);
}

// The kernel: the body above, kCells its dropout mask path (dropout_lanes.cuh); a dropout call
// with position offsets launches both kernels and the one that does not match returns at once.
template <class Cfg, typename Element, bool Has_dropout = false, bool Is_sparse = false,
          bool Has_score_mod = false, bool Is_det = false, bool kCells = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel_sm90(const __grid_constant__ sm80::BwdArgs args,
                    const __grid_constant__ BwdMaps maps, int sect, int list_cap) {
  if constexpr (Has_dropout) {
    if (dropout_cells_call(args.p) != kCells) return;
  }
  bwd_body_sm90<Cfg, Element, Has_dropout, Is_sparse, Has_score_mod, Is_det, kCells>(
      args, maps, sect, list_cap);
}

}  // namespace flashattn::sm90
