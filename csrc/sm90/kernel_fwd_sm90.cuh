// Prototype Hopper forward (sm_90a), not yet wired into the package: d = dv = 128, bf16,
// padded batches, any window (causal included), GQA. One CTA per 128 query rows of a (head,
// batch). Warpgroup 0 loads with TMA: Q once, K and V through a two-stage ring of full and
// empty mbarriers. Warpgroups 1 and 2 take 64 query rows each: S = Q K^T and O += P V by
// WGMMA, the online softmax in registers between them. Checked and timed against the sm80
// kernel by tools/selftest_fwd_sm90.cu. Not yet: overlap of softmax with the next GEMM.
#pragma once
#include <cuda.h>  // CUtensorMap (types only)
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "../common/mask.h"
#include "../common/params.h"
#include "primitives_sm90.cuh"

namespace flashattn::sm90 {

struct FwdMaps {
  CUtensorMap q, k, v;
};

constexpr int kFwdBM = 128, kFwdBN = 128, kFwdD = 128, kFwdStages = 2, kFwdThreads = 384;
// Shared memory, byte offsets of 1024-aligned parts: Q, then the K and V stages, each a
// 128 x 128 bf16 tile stored as two 64-column halves of 128 rows x 128 bytes (TMA's 128-byte
// swizzle), then the mbarriers.
constexpr int kFwdTile = kFwdBM * kFwdD * 2, kFwdHalf = kFwdTile / 2;
constexpr int kFwdSmemK = kFwdTile, kFwdSmemV = kFwdSmemK + kFwdStages * kFwdTile;
constexpr int kFwdSmemBar = kFwdSmemV + kFwdStages * kFwdTile;
constexpr int kFwdSmem = kFwdSmemBar + 64 + 1024;  // + alignment slack

struct KeyBlocks {
  int lo, hi;  // key blocks [lo, hi) meet some row of the query block
};
__device__ __forceinline__ KeyBlocks key_blocks(const MaskInfo& mi, int m0) {
  const int last = min(m0 + kFwdBM, mi.seqlen_q) - 1;
  const int kb = mi.key_begin(m0), ke = mi.key_end(last);  // both grow with the row
  if (ke <= kb) return {0, 0};
  return {kb / kFwdBN, (ke + kFwdBN - 1) / kFwdBN};
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__global__ void __launch_bounds__(kFwdThreads, 1)
    fwd_kernel_sm90(const __grid_constant__ FwdParams p, const __grid_constant__ FwdMaps maps) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + kFwdSmemBar);
  uint64_t* kv_full = q_full + 1;
  uint64_t* kv_empty = kv_full + kFwdStages;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (p.nheads / p.nheads_k);
  const int m0 = blockIdx.x * kFwdBM;
  const MaskInfo mi{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  const KeyBlocks kbl = key_blocks(mi, m0);
  const int n_iters = kbl.hi - kbl.lo;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kFwdStages; ++s) {
      mbar_init(kv_full + s, 1);
      mbar_init(kv_empty + s, 256);  // every consumer thread
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // producer: one thread issues every copy
    setmaxnreg_dec<40>();
    if (t == 0 && n_iters > 0) {
      mbar_arrive_expect_tx(q_full, kFwdTile);
      for (int half = 0; half < 2; ++half)
        tma_load_4d(smem + half * kFwdHalf, &maps.q, q_full, half * 64, m0, h, b);
      for (int it = 0; it < n_iters; ++it) {  // key blocks from the last (masked) down
        const int stage = it % kFwdStages, use = it / kFwdStages;
        if (use > 0) mbar_wait(kv_empty + stage, (use - 1) & 1);
        const int n0 = (kbl.hi - 1 - it) * kFwdBN;
        mbar_arrive_expect_tx(kv_full + stage, 2 * kFwdTile);
        uint8_t* sk = smem + kFwdSmemK + stage * kFwdTile;
        uint8_t* sv = smem + kFwdSmemV + stage * kFwdTile;
        for (int half = 0; half < 2; ++half) {
          tma_load_4d(sk + half * kFwdHalf, &maps.k, kv_full + stage, half * 64, n0, hk, b);
          tma_load_4d(sv + half * kFwdHalf, &maps.v, kv_full + stage, half * 64, n0, hk, b);
        }
      }
    }
    return;
  }

  setmaxnreg_inc<232>();
  const int c = wg - 1, warp = t / 32, lane = t % 32;
  const int row0 = m0 + c * 64 + warp * 16 + lane / 4;  // this thread's rows: row0, row0 + 8
  int kb[2], ke[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    kb[r] = mi.key_begin(row0 + 8 * r);
    ke[r] = mi.key_end(row0 + 8 * r);
  }
  const float scale_log2 = p.softmax_scale_log2;
  float o[64], row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;

  if (n_iters > 0) mbar_wait(q_full, 0);
  const uint32_t q_base = smem_u32(smem) + c * 64 * 128;  // this warpgroup's 64 rows
  for (int it = 0; it < n_iters; ++it) {
    const int stage = it % kFwdStages;
    mbar_wait(kv_full + stage, (it / kFwdStages) & 1);
    const uint32_t k_base = smem_u32(smem + kFwdSmemK + stage * kFwdTile);
    const uint32_t v_base = smem_u32(smem + kFwdSmemV + stage * kFwdTile);
    float s[64];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kFwdD / 16; ++kk) {
      const uint32_t off = (kk / 4) * kFwdHalf + (kk % 4) * 32;
      wgmma_m64n128k16_ss<false>(s, gmma_desc_sw128(q_base + off, 16, 1024),
                                 gmma_desc_sw128(k_base + off, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s);

    const int n0 = (kbl.hi - 1 - it) * kFwdBN;
    if (n0 < kb[0] || n0 < kb[1] || n0 + kFwdBN > ke[0] || n0 + kFwdBN > ke[1]) {
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n0 + j * 8 + (lane % 4) * 2 + (e & 1), r = e >> 1;
          if (col < kb[r] || col >= ke[r]) s[j * 4 + e] = -INFINITY;
        }
    }
    // Online softmax per row (4 lanes share a row).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + 2 * r], s[j * 4 + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
      const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
      const float alpha = row_max[r] == -INFINITY ? 0.f : exp2f(row_max[r] * scale_log2 - m_scaled);
      row_max[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = exp2f(s[j * 4 + 2 * r + e] * scale_log2 - m_scaled);
          s[j * 4 + 2 * r + e] = pv;
          sum += pv;
          o[j * 4 + 2 * r + e] *= alpha;
        }
      row_sum[r] = row_sum[r] * alpha + sum;
    }
    uint32_t pa[kFwdBN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kFwdBN / 16; ++kk) {
      const float* s0 = s + 8 * kk;  // n8 blocks 2 kk and 2 kk + 1
      pa[kk][0] = pack_bf16x2(s0[0], s0[1]);
      pa[kk][1] = pack_bf16x2(s0[2], s0[3]);
      pa[kk][2] = pack_bf16x2(s0[4], s0[5]);
      pa[kk][3] = pack_bf16x2(s0[6], s0[7]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kFwdBN / 16; ++kk)
      wgmma_m64n128k16_rs<true>(o, pa[kk], gmma_desc_sw128(v_base + kk * 16 * 128, kFwdHalf, 1024),
                                1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    mbar_arrive(kv_empty + stage);
  }

  // Epilogue: O / rowsum in bf16 straight from registers; lse = max * scale + ln(sum), -inf
  // (and O = 0) for a row with no visible key.
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.o_ptr) + b * p.o_batch_stride +
                       h * p.o_head_stride;
  float* lse = p.lse_ptr + b * p.lse_batch_stride + h * p.lse_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    const int row = row0 + 8 * r;
    if (row >= p.seqlen_q) continue;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    __nv_bfloat16* orow = out + row * p.o_row_stride + (lane % 4) * 2;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<uint32_t*>(orow + j * 8) =
          pack_bf16x2(o[j * 4 + 2 * r] * inv, o[j * 4 + 2 * r + 1] * inv);
    if (lane % 4 == 0)
      lse[row] = sum == 0.f ? -INFINITY : row_max[r] * scale_log2 * 0.6931471805599453f + logf(sum);
  }
}

}  // namespace flashattn::sm90
