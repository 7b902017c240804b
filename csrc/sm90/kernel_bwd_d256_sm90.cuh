// The Hopper backward's main kernel at head dim 256 (sm_90a), bf16 / fp16: FA4's d 256 split
// in our primitives (benchmarks/NOTES.md, "sm90 backward at d 256"): the package's 256 bucket
// (launch_bwd_sm90.cuh's run_bwd_hdim), also checked and timed by
// tools/selftest/selftest_bwd_sm80.cu (-DSELFTEST_SM90 -DSELFTEST_D256). Between the sm80
// backward's preprocessing and conversions, as kernel_bwd_sm90.cuh (whose BwdArgs, tensor
// maps, producer warps and launch order it shares).
//
// At d 256 dK + dV of 64 keys are 64 x 256 x 2 fp32: one warpgroup cannot hold them (256
// registers a thread), so the two consumer warpgroups split them along the head dim. One CTA
// per kBN = 64 keys, looping over blocks of kBM = 64 queries (Q, dO, their stats in one stage).
// Consumer c, per query block:
//   S^T, dP^T = K Q_c^T, V dO_c^T   (all 64 keys as M, its 32 queries c as N; A, B shared)
//   P^T = exp2(S^T scale - lse2), dS^T = P^T (dP^T - D), both into shared memory (64 keys x
//   64 queries, one 128-byte row a key), a 256-thread barrier: both halves written;
//   dV_c += P^T dO_c, dK_c += dS^T Q_c   (its 128 head-dim columns c as N; A = P^T / dS^T)
//   dQ_c = dS K_c                        (64 queries x its 128 columns; A = the dS^T buffer
//                                         read M-major), staged for warp 1's TMA reduce-add.
// Accumulators: dK, dV 64 + 64, dQ 64, S^T, dP^T 16 + 16 fp32 registers a thread. Shared
// memory: K, V, Q, dO 32 KB each, P^T and dS^T two buffers of 8 KB each, dQ 2 x 32 KB.
#pragma once
#include <cuda.h>  // CUtensorMap (types only)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "../common/mask.h"
#include "../common/params.h"
#include "../common/seqlen.h"
#include "../sm80/kernel_bwd_aux_sm80.cuh"
#include "kernel_bwd_sm90.cuh"  // BwdMaps, bwd_block_coord
#include "primitives_bwd_sm90.cuh"

namespace flashattn::sm90 {

struct BwdConfigD256 {
  static constexpr int kD = 256, kBM = 64, kBN = 64, kConsumers = 2;
  static constexpr int kThreads = (kConsumers + 1) * 128;
  static constexpr int kQHalf = kBM / kConsumers;  // queries of S^T / dP^T per consumer
  static constexpr int kDHalf = kD / kConsumers;   // head-dim columns of dK / dV / dQ per consumer
  // A tile of R rows x 256 columns is stored as 4 chunks of R rows x 128 bytes (128-byte
  // swizzle, the TMA boxes of 64 columns); P^T / dS^T: 64 keys x 64 queries, one chunk; the
  // dQ stage of a consumer: 64 queries x 128 fp32 as 4 chunks of 32 columns (the reduce box).
  static constexpr int kKVChunk = kBN * 128, kQChunk = kBM * 128, kPChunk = kBN * 128;
  static constexpr int kDQChunk = kBM * 128;
  static constexpr int kKBytes = kBN * kD * 2, kQBytes = kBM * kD * 2, kPBytes = kBN * kBM * 2;
  static constexpr int kDQBytes = kBM * kDHalf * 4, kStatBytes = 2 * kBM * 4;
  static constexpr int kSmemK = 0, kSmemV = kKBytes, kSmemQ = 2 * kKBytes;
  static constexpr int kSmemDO = kSmemQ + kQBytes;
  static constexpr int kSmemP = kSmemDO + kQBytes;  // P^T [2], then dS^T [2]
  static constexpr int kSmemDS = kSmemP + 2 * kPBytes;
  static constexpr int kSmemDQ = kSmemDS + 2 * kPBytes;
  static constexpr int kSmemStat = kSmemDQ + kConsumers * kDQBytes;
  static constexpr int kSmemBar = kSmemStat + kStatBytes;
  static constexpr int kSmem = kSmemBar + 128 + 1024;
  static_assert(kSmem <= 232448, "Hopper's opt-in shared memory per block (227 KB)");
  // Named barriers: both consumers' P^T / dS^T written; per consumer its dQ stage written
  // (consumer -> warp 1) and read by the reduce (warp 1 -> consumer).
  static constexpr int kBarPDS = 1, kBarDQFull = 2, kBarDQEmpty = 2 + kConsumers;
  static constexpr int kBarDet = kBarDQEmpty + kConsumers;  // the consumers (bwd_dkv_turn_*)
  // Deterministic, two dQ warps (bwd_dq_warp): kBarDQHand and kBarDQHand + 1, one per receiving
  // warp (bwd_dq_hand_barrier).
  static constexpr int kBarDQHand = kBarDet + 1;
  static constexpr int kDQBarThreads = 128 + 32;
  // For the producer's warps shared with the d64 / d128 kernel (bwd_load_warp, bwd_dq_warp):
  // one stage of Q / dO / stats; consumer c's dQ stage: its kDHalf columns from kDHalf c.
  static constexpr int kStages = 1, kAblate = 0, kDQChunks = kDHalf / 32;
  static constexpr __device__ int dq_col(int c) { return kDHalf * c; }
  static constexpr __device__ int dq_row(int) { return 0; }
};

// Has_score_mod: softcap and / or ALiBi (kernel_bwd_sm90.cuh's bwd_score_mod). Has_dropout:
// the forward's keep mask regenerated per block (bwd_keep_bits_st, this warp's 16 keys x the
// consumer's 32 queries); dV takes P^T Z scale, dS^T = P^T (Z scale dP^T - D), as the d64 /
// d128 kernel computes them (not with a score transform: the launch sends those to sm80).
// Is_det: deterministic=True (kernel_bwd_sm90.cuh's bwd_dq_warp / bwd_dkv_turn_* orders).
template <typename Element, bool Has_score_mod, bool Has_dropout, bool Is_det, bool kCells>
__device__ __forceinline__ void bwd_body_d256_sm90(const sm80::BwdArgs& args,
                                                   const BwdMaps& maps, int sect) {
  using Cfg = BwdConfigD256;
  constexpr int kD = Cfg::kD, kBM = Cfg::kBM, kBN = Cfg::kBN;
  constexpr int kQH = Cfg::kQHalf, kDH = Cfg::kDHalf;
  static_assert(24 + Cfg::kConsumers * 240 <=
                    (Cfg::kConsumers + 1) * ((65536 / Cfg::kThreads) & ~7),
                "the roles' registers fit the CTA's pool");
  const BwdParams& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem0 = smem_u32(smem);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Cfg::kSmemBar);
  uint64_t* q_full = kv_full + 1;
  uint64_t* q_empty = q_full + 1;
  int n_block, h, b;
  const bool det_diag = Is_det && args.det_diag;  // the host's choice (launch_bwd_sm90.cuh)
  bwd_block_coord<Is_det>(sect, n_block, h, b, nullptr, det_diag);
  const int hk = h / args.group;
  const SeqInfo si = sm80::bwd_detail::seq_info_clamped(p, b);
  const int n0 = n_block * kBN;
  if (n0 >= si.seqlen_k) return;  // varlen: past this sequence (the whole CTA leaves)
  const MaskInfo mi{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right,
                    pos_shift_of(p, b)};
  const QueryBlockRange qr = bwd_query_blocks(mi, n_block, kBM, kBN);  // bwd_layout_sm90.h
  const int m_lo = qr.m_lo, n_iters = qr.count;
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);  // warp-uniform
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  if (threadIdx.x == 0) {
    mbar_init(kv_full, 1);
    mbar_init(q_full, 1 + 32);  // warp 0: lane 0's expect-tx, then every lane's stats
    mbar_init(q_empty, Cfg::kConsumers * 128);
    mbar_init_fence();
  }
  __syncthreads();

  auto m_block = [&](int it) {
    return bwd_m_block<Is_det, false>(it, m_lo, n_iters, nullptr, det_diag);
  };
  if (wg == 0) {
    setmaxnreg_dec<24>();
    // (Deterministic calls: warps 1 and 2 take the dQ blocks in turn under det_dq_warps 2.)
    const int dq_warps = Is_det ? args.det_dq_warps : 1;
    if (n_iters == 0 || warp > dq_warps) return;
    if (warp == 0)  // Q, dO and their stats in one stage (kStages 1)
      bwd_load_warp<Cfg>(p, maps, smem, smem0, kv_full, q_full, q_empty, si, b, h, hk, n0,
                         n_iters, lane, m_block);
    else
      bwd_dq_warp<Cfg, Is_det>(args, maps, smem0, si, mi, b, h, n_block, n_iters, lane,
                               m_block, warp - 1, dq_warps);
    return;
  }

  setmaxnreg_inc<240>();
  const int c = wg - 1, g = lane / 4;
  // This thread's keys (the rows of S^T, dK, dV): kr[0], kr[1] = kr[0] + 8, both consumers
  // alike, and the queries that see each, [qb, qe) (empty for keys past the sequence).
  int kr[2], qb[2], qe[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    kr[r] = n0 + warp * 16 + g + 8 * r;
    const bool in = kr[r] < si.seqlen_k;
    qb[r] = in ? mi.query_begin(kr[r]) : 0;
    qe[r] = in ? mi.query_end(kr[r]) : 0;
  }
  const bool keys_in = n0 + kBN <= si.seqlen_k;
  const int full_lo = keys_in ? mi.query_begin(n0 + kBN - 1) : 0;
  const int full_hi = keys_in ? mi.query_end(n0) : 0;
  const float scale_log2 = p.softmax_scale_log2;
  const BwdScoreMod smod = Has_score_mod ? bwd_score_mod(p, b, h, mi) : BwdScoreMod{};
  DropoutRng rng{};
  if constexpr (Has_dropout)
    rng = dropout_rng(p.rng_state, p.dropout_threshold, b, h, q_pos_of(p, b), k_pos_of(p, b));
  float dk[kDH / 2], dv[kDH / 2];
#pragma unroll
  for (int i = 0; i < kDH / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint32_t k_smem = smem0 + Cfg::kSmemK, v_smem = smem0 + Cfg::kSmemV;
  const uint32_t q_smem = smem0 + Cfg::kSmemQ, do_smem = smem0 + Cfg::kSmemDO;
  const uint32_t stat = smem0 + Cfg::kSmemStat;
  const uint32_t dq_smem = smem0 + Cfg::kSmemDQ + c * Cfg::kDQBytes;
  const uint64_t k_desc = gmma_desc_sw128(k_smem, 16, 1024);
  const uint64_t v_desc = gmma_desc_sw128(v_smem, 16, 1024);
  // This consumer's 32 queries of Q / dO (B of S^T, dP^T: K-major rows 32 c ..).
  const uint64_t qc_desc = gmma_desc_sw128(q_smem + c * kQH * 128, 16, 1024);
  const uint64_t doc_desc = gmma_desc_sw128(do_smem + c * kQH * 128, 16, 1024);
  // Its 128 head-dim columns (chunks 2 c, 2 c + 1) of dO, Q, K: the N-major B of dV, dK, dQ.
  const uint64_t do_cols = gmma_desc_sw128(do_smem + 2 * c * Cfg::kQChunk, Cfg::kQChunk, 1024);
  const uint64_t q_cols = gmma_desc_sw128(q_smem + 2 * c * Cfg::kQChunk, Cfg::kQChunk, 1024);
  const uint64_t k_cols = gmma_desc_sw128(k_smem + 2 * c * Cfg::kKVChunk, Cfg::kKVChunk, 1024);

  if (n_iters > 0) mbar_wait(kv_full, 0);
  for (int it = 0; it < n_iters; ++it) {
    const int m0 = m_block(it) * kBM;
    const uint32_t pt_base = smem0 + Cfg::kSmemP + (it & 1) * Cfg::kPBytes;
    const uint32_t ds_base = smem0 + Cfg::kSmemDS + (it & 1) * Cfg::kPBytes;
    const bool masked = !keys_in || m0 < full_lo || min(m0 + kBM, si.seqlen_q) > full_hi;
    uint32_t zbits[(kQH / 2 + 31) / 32];  // drawn before the MMAs hold their accumulators
    if constexpr (Has_dropout)
      bwd_keep_bits_st<kQH, kCells>(rng, (m0 + c * kQH) >> 4, (n0 + warp * 16) >> 4, lane,
                                    zbits);
    auto z = [&](int i) {  // element i's dropout factor
      if constexpr (Has_dropout) return (zbits[i / 32] >> (i % 32)) & 1u ? p.dropout_scale : 0.f;
      return 1.f;
    };
    mbar_wait(q_full, it & 1);
    float st[kQH / 2], dpt[kQH / 2];
    // acc = A B^T over the 256 head-dim columns, both K-major: A the 64 keys, B 32 queries.
    auto mma_keys_queries = [&](float (&acc)[kQH / 2], uint64_t a_desc, uint64_t b_desc) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t in_row = (kk % 4) * 32;  // 16 columns of a 128-byte row
        wgmma_ss<false, Element>(acc, desc_add(a_desc, (kk / 4) * Cfg::kKVChunk + in_row),
                                 desc_add(b_desc, (kk / 4) * Cfg::kQChunk + in_row), kk > 0);
      }
    };
    wgmma_fence();
    mma_keys_queries(st, k_desc, qc_desc);  // S^T = K Q_c^T
    wgmma_commit();
    mma_keys_queries(dpt, v_desc, doc_desc);  // dP^T = V dO_c^T
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_operands(st);
    // P^T = exp2(score(S^T) - lse2); this thread's queries: c * 32 + j * 8 + (lane % 4) * 2 + e.
    __half2 dth[Has_score_mod ? kQH / 4 : 1];
    bwd_probs_st<kQH, Has_score_mod>(st, dth, stat + c * kQH * 4, m0 + c * kQH, lane, kr, qb, qe,
                                     masked, scale_log2, smod);
    wgmma_wait<0>();
    wgmma_fence_operands(dpt);
    bwd_dscores_st<kQH, Has_score_mod>(dpt, st, dth, stat + (kBM + c * kQH) * 4, lane,
                                       smod.has_cap, z);
    // P^T and dS^T into shared memory: row = key, this consumer's 32 query columns of the
    // 128-byte row (16-byte units 4 c + j, XOR row % 8 = g): the K-major A of dV / dK, and
    // (dS^T) the M-major A of dQ = dS K.
#pragma unroll
    for (int j = 0; j < kQH / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t off =
            (warp * 16 + g + 8 * r) * 128 + (((c * kQH / 8 + j) ^ g) * 16) + (lane % 4) * 4;
        const int i = j * 4 + 2 * r;  // P^T Z scale for dV (P^T itself without dropout)
        sts_u32(pt_base + off, pack_x2<Element>(st[i] * z(i), st[i + 1] * z(i + 1)));
        sts_u32(ds_base + off, pack_x2<Element>(dpt[j * 4 + 2 * r], dpt[j * 4 + 2 * r + 1]));
      }
    fence_async_shared();
    // Both consumers' halves are written. Also orders the buffers' reuse two blocks on: each
    // consumer's MMAs of block it - 2 completed before it reached this barrier at it - 1.
    named_bar_sync(Cfg::kBarPDS, Cfg::kConsumers * 128);
    const uint64_t pt_desc = gmma_desc_sw128(pt_base, 16, 1024);
    const uint64_t dst_desc = gmma_desc_sw128(ds_base, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)  // dV_c += P^T dO_c: K = 64 queries, 16 a step
      wgmma_ss<true, Element>(dv, desc_add(pt_desc, kk * 32), desc_add(do_cols, kk * 16 * 128),
                              1);
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)  // dK_c += dS^T Q_c
      wgmma_ss<true, Element>(dk, desc_add(dst_desc, kk * 32), desc_add(q_cols, kk * 16 * 128),
                              1);
    wgmma_commit();
    float dq[kDH / 2];
    // dQ_c = dS K_c: A = dS (64 queries x 64 keys) from the dS^T buffer, M-major; K = keys.
    const uint64_t dq_a_desc = gmma_desc_sw128(ds_base, Cfg::kPChunk, 1024);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      wgmma_ss<true, Element, true>(dq, desc_add(dq_a_desc, kk * 16 * 128),
                                    desc_add(k_cols, kk * 16 * 128), kk > 0);
    wgmma_commit();
    wgmma_wait<1>();  // dV and dK done (Q, dO and the stats read); dQ may still run
    wgmma_fence_operands(dk);
    wgmma_fence_operands(dv);
    mbar_arrive(q_empty);
    wgmma_wait<0>();
    wgmma_fence_operands(dq);
    if (it > 0) named_bar_sync(Cfg::kBarDQEmpty + c, Cfg::kDQBarThreads);  // last stage read
    bwd_stage_dq<kDH, Cfg::kDQChunk>(dq_smem, dq, warp, lane);  // the dQ stage, for warp 1
    fence_async_shared();
    named_bar_arrive(Cfg::kBarDQFull + c, Cfg::kDQBarThreads);
  }

  // dK (scaled) and dV of this consumer's 128 columns (nothing to add from a key block that
  // saw no query block under GQA).
  if constexpr (Is_det) {
    if (args.dk_accum != nullptr) {  // GQA: in head order, a turn taken even with nothing to add
      int* sem = bwd_dkv_turn_wait<Cfg>(args, b, h, hk, n_block);
      if (n_iters > 0)
        bwd_store_dk_dv<Element, kDH, kD>(args, si, b, hk, kr, c * kDH, lane, dk, dv);
      bwd_dkv_turn_end<Cfg>(sem);
      return;
    }
  }
  if (args.dk_accum != nullptr && n_iters == 0) return;
  bwd_store_dk_dv<Element, kDH, kD>(args, si, b, hk, kr, c * kDH, lane, dk, dv);
}

// The kernel: the body above, kCells its dropout mask path (dropout_lanes.cuh); a dropout call
// with position offsets launches both kernels and the one that does not match returns at once.
template <typename Element, bool Has_score_mod = false, bool Has_dropout = false,
          bool Is_det = false, bool kCells = false>
__global__ void __launch_bounds__(BwdConfigD256::kThreads, 1)
    bwd_kernel_d256_sm90(const __grid_constant__ sm80::BwdArgs args,
                         const __grid_constant__ BwdMaps maps, int sect) {
  if constexpr (Has_dropout) {
    if (dropout_cells_call(args.p) != kCells) return;
  }
  bwd_body_d256_sm90<Element, Has_score_mod, Has_dropout, Is_det, kCells>(args, maps, sect);
}

}  // namespace flashattn::sm90
