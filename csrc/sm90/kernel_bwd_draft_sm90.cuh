// The first Hopper backward main kernel (the draft), kept only so that one GPU run can time it
// beside its successor (kernel_bwd_sm90.cuh) and be deleted after. Correct on the H200
// (2026-12-02) but 0.45-0.6x the sm80 backward: benchmarks/NOTES.md, "sm90 backward: why the
// draft is slow". Structure: one CTA per 128 keys; warpgroup 0 loads K, V once and Q, dO per
// query block (TMA); consumer c owns keys [64 c, 64 c + 64):
//   S^T = K Q^T, dP^T = V dO^T; P^T, dS^T; dV += P^T dO, dK += dS^T Q; dQ = dS K over its own
// 64 keys, added into the fp32 accumulator row by row with bulk reduce-adds.
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
#include "kernel_bwd_sm90.cuh"  // BwdMaps
#include "primitives_bwd_sm90.cuh"

namespace flashattn::sm90 {

template <int kD_, int kBM_, int kStages_>
struct BwdDraftConfig {
  static constexpr int kD = kD_, kBM = kBM_, kStages = kStages_;
  static constexpr bool kDraft = true;
  static constexpr int kBN = 128, kConsumers = 2, kThreads = (kConsumers + 1) * 128;
  static_assert(kD == 64 || kD == 128, "d 64 or 128 so far");
  static_assert(kBM == 64, "a dS^T row of kBM queries is one 128-byte swizzle row");
  // Shared memory (byte offsets, 1024-aligned parts): K, V (kBN x kD), the Q and dO stages
  // (kBM x kD), a dS^T tile per consumer (64 keys x kBM), a dQ tile per consumer (kBM x kD
  // fp32, plain row-major: the bulk reduce-add's source rows), then the mbarriers.
  static constexpr int kKVChunk = kBN * 128, kQChunk = kBM * 128;
  static constexpr int kKBytes = kBN * kD * 2, kQBytes = kBM * kD * 2;
  static constexpr int kDSBytes = 64 * kBM * 2, kDQBytes = kBM * kD * 4;
  static constexpr int kSmemK = 0, kSmemV = kKBytes, kSmemQ = 2 * kKBytes;
  static constexpr int kSmemDO = kSmemQ + kStages * kQBytes;
  static constexpr int kSmemDS = kSmemDO + kStages * kQBytes;
  static constexpr int kSmemDQ = kSmemDS + kConsumers * kDSBytes;
  static constexpr int kSmemBar = kSmemDQ + kConsumers * kDQBytes;
  static constexpr int kSmem = kSmemBar + 128 + 1024;
  static_assert((1 + 2 * kStages) * 8 <= 128, "the mbarriers fit their 128 bytes");
  static_assert(kSmem <= 232448, "Hopper's opt-in shared memory per block (227 KB)");
};

template <class Cfg, typename Element>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_draft_kernel_sm90(const __grid_constant__ sm80::BwdArgs args,
                          const __grid_constant__ BwdMaps maps) {
  constexpr int kD = Cfg::kD, kBM = Cfg::kBM, kBN = Cfg::kBN, kStages = Cfg::kStages;
  const BwdParams& p = args.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Cfg::kSmemBar);
  uint64_t* q_full = kv_full + 1;
  uint64_t* q_empty = q_full + kStages;
  const int n_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / args.group;
  const SeqInfo si = sm80::bwd_detail::seq_info_clamped(p, b);
  const int n0 = n_block * kBN;
  if (n0 >= si.seqlen_k) return;  // varlen: past this sequence (the whole CTA leaves)
  const MaskInfo mi{si.seqlen_q, si.seqlen_k, p.window_left, p.window_right};
  // Queries that see some key of the block: one interval (both ends grow with the key).
  const int n_last = min(n0 + kBN, si.seqlen_k) - 1;
  const int q_lo = mi.query_begin(n0), q_hi = mi.query_end(n_last);
  const int m_lo = q_lo / kBM, n_iters = q_hi > q_lo ? (q_hi + kBM - 1) / kBM - m_lo : 0;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    mbar_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(q_full + s, 1);
      mbar_init(q_empty + s, Cfg::kConsumers * 128);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int tb = p.is_varlen ? 0 : b;  // TMA rows: q_row0 / k_row0 + r
  if (wg == 0) {  // producer: one thread issues every copy
    setmaxnreg_dec<24>();
    if (t != 0 || n_iters == 0) return;
    auto load = [&](uint8_t* dst, const CUtensorMap* map, uint64_t* bar, int col, int64_t row,
                    int head) {
      if (p.is_varlen) tma_load_3d(dst, map, bar, col, static_cast<int>(row), head);
      else tma_load_4d(dst, map, bar, col, static_cast<int>(row), head, tb);
    };
    mbar_arrive_expect_tx(kv_full, 2 * Cfg::kKBytes);
#pragma unroll
    for (int c = 0; c < kD / 64; ++c) {
      load(smem + Cfg::kSmemK + c * Cfg::kKVChunk, &maps.k, kv_full, c * 64, si.k_row0 + n0, hk);
      load(smem + Cfg::kSmemV + c * Cfg::kKVChunk, &maps.v, kv_full, c * 64, si.k_row0 + n0, hk);
    }
    for (int it = 0; it < n_iters; ++it) {
      const int stage = it % kStages, use = it / kStages;
      const int64_t row = si.q_row0 + int64_t(m_lo + it) * kBM;
      if (use > 0) mbar_wait(q_empty + stage, (use - 1) & 1);
      mbar_arrive_expect_tx(q_full + stage, 2 * Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < kD / 64; ++c) {
        load(smem + Cfg::kSmemQ + stage * Cfg::kQBytes + c * Cfg::kQChunk, &maps.q,
             q_full + stage, c * 64, row, h);
        load(smem + Cfg::kSmemDO + stage * Cfg::kQBytes + c * Cfg::kQChunk, &maps.dout,
             q_full + stage, c * 64, row, h);
      }
    }
    return;
  }

  setmaxnreg_inc<240>();
  const int c = wg - 1, warp = t / 32, lane = t % 32;
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
  const float scale_log2 = p.softmax_scale_log2;
  float dk[kD / 2], dv[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.f;
  const uint32_t k_base = smem_u32(smem + Cfg::kSmemK) + c * 64 * 128;  // this WG's 64 keys
  const uint32_t v_base = smem_u32(smem + Cfg::kSmemV) + c * 64 * 128;
  uint8_t* ds_tile = smem + Cfg::kSmemDS + c * Cfg::kDSBytes;
  float* dq_tile = reinterpret_cast<float*>(smem + Cfg::kSmemDQ + c * Cfg::kDQBytes);
  const float* lse = p.lse_ptr + b * p.lse_batch_stride + h * p.lse_head_stride + si.q_row0;
  const float* dsum = p.dsoftmax_sum + b * p.lse_batch_stride + h * p.lse_head_stride + si.q_row0;
  float* dq_accum = args.dq_accum +
                    (sm80::bwd_detail::q_row_global(p, b, si) * p.nheads + h) * int64_t(kD);

  if (n_iters > 0) mbar_wait(kv_full, 0);
  for (int it = 0; it < n_iters; ++it) {
    const int stage = it % kStages, m0 = (m_lo + it) * kBM;
    const uint32_t q_base = smem_u32(smem + Cfg::kSmemQ + stage * Cfg::kQBytes);
    const uint32_t do_base = smem_u32(smem + Cfg::kSmemDO + stage * Cfg::kQBytes);
    mbar_wait(q_full + stage, (it / kStages) & 1);
    float st[kBM / 2], dpt[kBM / 2];
    // acc = A B^T over kD, both K-major: A this warpgroup's 64 keys, B the kBM queries.
    auto mma_keys_queries = [&](float (&acc)[kBM / 2], uint32_t a_base, uint32_t b_base) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t in_row = (kk % 4) * 32;  // 16 columns of a 128-byte row
        wgmma_ss<false, Element>(
            acc, gmma_desc_sw128(a_base + (kk / 4) * Cfg::kKVChunk + in_row, 16, 1024),
            gmma_desc_sw128(b_base + (kk / 4) * Cfg::kQChunk + in_row, 16, 1024), kk > 0);
      }
    };
    wgmma_fence();
    mma_keys_queries(st, k_base, q_base);    // S^T = K Q^T
    mma_keys_queries(dpt, v_base, do_base);  // dP^T = V dO^T
    wgmma_commit();
    // lse (in log2 units) and D of this thread's query columns, while the MMAs run. Columns
    // past the sequence: lse +inf (P = 0; they are masked too).
    float lse2[kBM / 4], dd[kBM / 4];
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = m0 + j * 8 + (lane % 4) * 2 + e;
        const bool in = i < si.seqlen_q;
        lse2[j * 2 + e] = in ? lse[i] * 1.4426950408889634f : INFINITY;
        dd[j * 2 + e] = in ? dsum[i] : 0.f;
      }
    wgmma_wait<0>();
    wgmma_fence_operands(st);
    wgmma_fence_operands(dpt);
    // P^T and dS^T, packed as the A operands of dV += P^T dO and dK += dS^T Q (K = queries).
    uint32_t ap[kBM / 16][4], ads[kBM / 16][4];
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, ci = j * 2 + (e & 1);
        const int i = m0 + j * 8 + (lane % 4) * 2 + (e & 1);
        const bool vis = i >= qb[r] && i < qe[r];
        // A row with no visible key has lse -inf; it is masked here, never exp2(+inf).
        const float pt = vis ? exp2_ftz(fmaf(st[j * 4 + e], scale_log2, -lse2[ci])) : 0.f;
        st[j * 4 + e] = pt;
        dpt[j * 4 + e] = pt * (dpt[j * 4 + e] - dd[ci]);
      }
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      const float* p0 = st + 8 * kk;
      const float* d0 = dpt + 8 * kk;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        ap[kk][q] = pack_x2<Element>(p0[2 * q], p0[2 * q + 1]);
        ads[kk][q] = pack_x2<Element>(d0[2 * q], d0[2 * q + 1]);
      }
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)  // 16 queries = 16 rows of 128 bytes
      wgmma_rs<true, Element>(
          dv, ap[kk], gmma_desc_sw128(do_base + kk * 16 * 128, Cfg::kQChunk, 1024), 1);
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      wgmma_rs<true, Element>(
          dk, ads[kk], gmma_desc_sw128(q_base + kk * 16 * 128, Cfg::kQChunk, 1024), 1);
    wgmma_commit();
    // dS^T into shared memory: row = key (64), 128 bytes of queries, 128-byte swizzle (16-byte
    // chunk index XOR row % 8), the layout the MMA reads as an M-major A (dS, queries x keys).
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp * 16 + lane / 4 + 8 * r, col = j * 8 + (lane % 4) * 2;
        const int off = row * 128 + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
        *reinterpret_cast<uint32_t*>(ds_tile + off) =
            pack_x2<Element>(dpt[j * 4 + 2 * r], dpt[j * 4 + 2 * r + 1]);
      }
    fence_async_shared();
    named_bar_sync(3 + c, 128);  // this warpgroup's dS^T is in shared memory
    // dQ = dS K in 64-column halves of kD (32 accumulators at a time beside dK and dV),
    // each into this warpgroup's shared tile once the last bulk reduce has read it.
    if (t == 0) bulk_wait_read<0>();
#pragma unroll
    for (int half = 0; half < kD / 64; ++half) {
      float dq[32];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 64 / 16; ++kk)  // K = this warpgroup's 64 keys, 16 at a time
        wgmma_ss<true, Element, true>(
            dq, gmma_desc_sw128(smem_u32(ds_tile) + kk * 16 * 128, 64 * 128, 1024),
            gmma_desc_sw128(k_base + half * Cfg::kKVChunk + kk * 16 * 128, Cfg::kKVChunk, 1024),
            kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(dq);
      if (half == 0) named_bar_sync(3 + c, 128);  // the last bulk reduce has read the tile
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = warp * 16 + lane / 4 + 8 * r, col = half * 64 + j * 8 + (lane % 4) * 2;
          *reinterpret_cast<float2*>(dq_tile + row * kD + col) =
              make_float2(dq[j * 4 + 2 * r], dq[j * 4 + 2 * r + 1]);
        }
    }
    wgmma_fence_operands(dk);
    wgmma_fence_operands(dv);
    mbar_arrive(q_empty + stage);  // Q and dO of this stage are read (every MMA is done)
    fence_async_shared();
    named_bar_sync(3 + c, 128);
    if (t == 0) {
      const int rows = min(kBM, si.seqlen_q - m0);
      for (int row = 0; row < rows; ++row)
        bulk_reduce_add_f32(dq_accum + int64_t(m0 + row) * p.nheads * kD, dq_tile + row * kD,
                            kD * 4);
      bulk_commit();
    }
  }
  if (t == 0) bulk_wait<0>();  // the reduce-adds complete before the CTA ends

  // dK (scaled) and dV: written in Element (MHA) or added into the fp32 accumulators (GQA).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (kr[r] >= si.seqlen_k) continue;
    const int64_t krow = si.k_row0 + kr[r];
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      const int col = j * 8 + (lane % 4) * 2;  // pairs: head dims are multiples of 8
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

}  // namespace flashattn::sm90
