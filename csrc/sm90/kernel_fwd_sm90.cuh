// The Hopper forward (sm_90a), d = dv = 128, bf16 / fp16: padded batches, any window (causal
// included), GQA. One CTA per 128 query rows of a (head, batch). Warpgroup 0 loads with TMA:
// Q once, K and V through a ring of full and empty mbarriers. Warpgroups 1 and 2 take 64 query
// rows each: S = Q K^T and O += P V by WGMMA, the online softmax in registers between them.
// Host side: launch_fwd_sm90.cuh; torch-free checks: tools/selftest/selftest_fwd_sm90.cu.
#pragma once
#include <cuda.h>  // CUtensorMap (types only)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "../common/mask.h"
#include "../common/params.h"
#include "primitives_sm90.cuh"
#include "tile_fwd_sm90.h"

namespace flashattn::sm90 {

struct FwdMaps {
  CUtensorMap q, k, v;
};

constexpr FwdTile kFwdTile128 = fwd_tile(128);
constexpr int kFwdBM = kFwdTile128.block_m, kFwdBN = kFwdTile128.block_n, kFwdD = 128;
constexpr int kFwdThreads = kFwdTile128.threads, kFwdStages = kFwdTile128.stages;
static_assert(kFwdBM == 128 && kFwdBN == 128 && kFwdThreads == 384,
              "the kernel's warp roles assume 128 x 128 tiles and three warpgroups");
// Shared memory, byte offsets of 1024-aligned parts: Q, then the K and V stages, each a
// 128 x 128 16-bit tile stored as two 64-column halves of 128 rows x 128 bytes (TMA's
// 128-byte swizzle), then the mbarriers: q_full, k_full[S], k_empty[S], v_full[S], v_empty[S].
constexpr int kFwdTileBytes = kFwdBM * kFwdD * 2, kFwdHalf = kFwdTileBytes / 2;
constexpr int kFwdSmemK = kFwdTileBytes, kFwdSmemV = kFwdSmemK + kFwdStages * kFwdTileBytes;
constexpr int kFwdSmemBar = kFwdSmemV + kFwdStages * kFwdTileBytes;
constexpr int kFwdSmem = kFwdSmemBar + 128 + 1024;  // + alignment slack
static_assert((1 + 4 * kFwdStages) * 8 <= 128, "the mbarriers fit their 128 bytes");
static_assert(kFwdSmem <= 232448, "Hopper's opt-in shared memory per block (227 KB)");

// Consumer schedules (the self-test times each; the serial one, S, wait, softmax, P V, wait,
// measured 10-15% slower than both, is gone: git has it):
//   kOverlap  : S of block j + 1 issued with P V of block j, the softmax of j + 1 under P V
//               (FA3's intra-warpgroup overlap); K released once S is done, V after P V.
//   kPingPong : kOverlap, and the two warpgroups take turns issuing their MMAs (named
//               barriers), so one's softmax runs under the other's GEMMs (FA3's ping-pong).
enum FwdSchedule : int { kOverlap = 1, kPingPong = 2 };

// Key blocks are visited from the last (the masked one, for causal) down; each head's longest
// query blocks launch first (blockIdx.x reversed).
template <typename Element, int kSchedule>
__global__ void __launch_bounds__(kFwdThreads, 1)
    fwd_kernel_sm90(const __grid_constant__ FwdParams p, const __grid_constant__ FwdMaps maps) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + kFwdSmemBar);
  uint64_t* k_full = q_full + 1;
  uint64_t* k_empty = k_full + kFwdStages;
  uint64_t* v_full = k_empty + kFwdStages;
  uint64_t* v_empty = v_full + kFwdStages;
  const int m_block = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.nheads / p.nheads_k), m0 = m_block * kFwdBM;
  const MaskInfo mi{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right};
  const MaskInfo::BlockRange kbl = mi.key_blocks(m0, min(m0 + kFwdBM, p.seqlen_q) - 1, kFwdBN);
  const int n_iters = kbl.hi - kbl.lo;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kFwdStages; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(v_full + s, 1);
      mbar_init(k_empty + s, 256);  // every consumer thread
      mbar_init(v_empty + s, 256);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // producer: one thread issues every copy
    setmaxnreg_dec<40>();
    if (t == 0 && n_iters > 0) {
      mbar_arrive_expect_tx(q_full, kFwdTileBytes);
      for (int half = 0; half < 2; ++half)
        tma_load_4d(smem + half * kFwdHalf, &maps.q, q_full, half * 64, m0, h, b);
      for (int it = 0; it < n_iters; ++it) {  // key blocks from the last (masked) down
        const int stage = it % kFwdStages, use = it / kFwdStages;
        const int n0 = (kbl.hi - 1 - it) * kFwdBN;
        uint8_t* sk = smem + kFwdSmemK + stage * kFwdTileBytes;
        uint8_t* sv = smem + kFwdSmemV + stage * kFwdTileBytes;
        if (use > 0) mbar_wait(k_empty + stage, (use - 1) & 1);
        mbar_arrive_expect_tx(k_full + stage, kFwdTileBytes);
        for (int half = 0; half < 2; ++half)
          tma_load_4d(sk + half * kFwdHalf, &maps.k, k_full + stage, half * 64, n0, hk, b);
        if (use > 0) mbar_wait(v_empty + stage, (use - 1) & 1);
        mbar_arrive_expect_tx(v_full + stage, kFwdTileBytes);
        for (int half = 0; half < 2; ++half)
          tma_load_4d(sv + half * kFwdHalf, &maps.v, v_full + stage, half * 64, n0, hk, b);
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
  float o[64], s[64], row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  float alpha[2];
  uint32_t pa[kFwdBN / 16][4], pb[kFwdBN / 16][4];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  const uint32_t q_base = smem_u32(smem) + c * 64 * 128;  // this warpgroup's 64 rows

  auto wait_k = [&](int it) { mbar_wait(k_full + it % kFwdStages, (it / kFwdStages) & 1); };
  auto wait_v = [&](int it) { mbar_wait(v_full + it % kFwdStages, (it / kFwdStages) & 1); };
  auto release_k = [&](int it) { mbar_arrive(k_empty + it % kFwdStages); };
  auto release_v = [&](int it) { mbar_arrive(v_empty + it % kFwdStages); };
  // Ping-pong: warpgroup c issues its MMAs between sync(1 + c) and an arrive on the other's
  // barrier; each barrier counts both warpgroups (256 threads).
  auto turn_begin = [&] {
    if constexpr (kSchedule == kPingPong) named_bar_sync(1 + c, 256);
  };
  auto turn_end = [&] {
    if constexpr (kSchedule == kPingPong) named_bar_arrive(2 - c, 256);
  };
  auto issue_qk = [&](int it) {  // S = Q K^T of iteration it (its K has landed)
    const int stage = it % kFwdStages;
    const uint32_t k_base = smem_u32(smem + kFwdSmemK + stage * kFwdTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kFwdD / 16; ++kk) {
      const uint32_t off = (kk / 4) * kFwdHalf + (kk % 4) * 32;
      wgmma_m64n128k16_ss<false, Element>(s, gmma_desc_sw128(q_base + off, 16, 1024),
                                          gmma_desc_sw128(k_base + off, 16, 1024), kk > 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int it, const uint32_t (&a)[kFwdBN / 16][4]) {
    const uint32_t v_base = smem_u32(smem + kFwdSmemV + (it % kFwdStages) * kFwdTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kFwdBN / 16; ++kk)
      wgmma_m64n128k16_rs<true, Element>(
          o, a[kk], gmma_desc_sw128(v_base + kk * 16 * 128, kFwdHalf, 1024), 1);
    wgmma_commit();
  };
  // Masks S of iteration it, updates the row max and sums (alpha: the factor O still needs),
  // and packs P = exp2(S * scale - max) into `a` as the A operand of P V.
  auto softmax = [&](int it, uint32_t (&a)[kFwdBN / 16][4]) {
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
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // 4 lanes share a row
      float mx = row_max[r];
#pragma unroll
      for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + 2 * r], s[j * 4 + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
      // -inf guards: a row with nothing visible yet keeps max -inf and P = 0 (exp2(-inf)).
      const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
      alpha[r] = row_max[r] == -INFINITY ? 0.f : exp2_ftz(row_max[r] * scale_log2 - m_scaled);
      row_max[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = exp2_ftz(fmaf(s[j * 4 + 2 * r + e], scale_log2, -m_scaled));
          s[j * 4 + 2 * r + e] = pv;
          sum += pv;
        }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int kk = 0; kk < kFwdBN / 16; ++kk) {
      const float* s0 = s + 8 * kk;  // n8 blocks 2 kk and 2 kk + 1
      a[kk][0] = pack_x2<Element>(s0[0], s0[1]);
      a[kk][1] = pack_x2<Element>(s0[2], s0[3]);
      a[kk][2] = pack_x2<Element>(s0[4], s0[5]);
      a[kk][3] = pack_x2<Element>(s0[6], s0[7]);
    }
  };
  auto rescale_o = [&]() {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j * 4 + e] *= alpha[e >> 1];
  };

  if (n_iters > 0) mbar_wait(q_full, 0);
  if (n_iters > 0) {
    // Turns: S_0; then (S_{j+1}, P_j V_j) for j < n - 1; then P_{n-1} V_{n-1}. Warpgroup 1
    // lets warpgroup 0 take the first turn and skips its own last arrive, so every sync has
    // its arrive and none is left over.
    if (kSchedule == kPingPong && c == 1) named_bar_arrive(1, 256);
    wait_k(0);
    turn_begin();
    issue_qk(0);
    turn_end();
    wgmma_wait<0>();
    wgmma_fence_operands(s);
    release_k(0);
    softmax(0, pa);
    // Two P buffers in turn (no copy the register allocator could fold into one), and each
    // step's MMAs in straight-line code: otherwise ptxas serialises the MMAs (C7513 / C7514)
    // because it cannot see that wait<1> retires S while P V still reads P.
    auto step = [&](int it, const uint32_t (&cur)[kFwdBN / 16][4],
                    uint32_t (&nxt)[kFwdBN / 16][4]) {
      wait_k(it + 1);
      wait_v(it);
      turn_begin();
      issue_qk(it + 1);
      issue_pv(it, cur);
      turn_end();
      wgmma_wait<1>();
      wgmma_fence_operands(s);
      release_k(it + 1);
      softmax(it + 1, nxt);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      release_v(it);
      rescale_o();
    };
    auto last = [&](int it, const uint32_t (&cur)[kFwdBN / 16][4]) {
      wait_v(it);
      turn_begin();
      issue_pv(it, cur);
      if (c == 0) turn_end();
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      release_v(it);
    };
    for (int it = 0;; it += 2) {
      if (it + 1 >= n_iters) { last(it, pa); break; }
      step(it, pa, pb);
      if (it + 2 >= n_iters) { last(it + 1, pb); break; }
      step(it + 1, pb, pa);
    }
  }

  // Epilogue: O / rowsum in Element straight from registers; lse = max * scale + ln(sum), -inf
  // (and O = 0) for a row with no visible key.
  Element* out = static_cast<Element*>(p.o_ptr) + b * p.o_batch_stride + h * p.o_head_stride;
  float* lse = p.lse_ptr + b * p.lse_batch_stride + h * p.lse_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    const int row = row0 + 8 * r;
    if (row >= p.seqlen_q) continue;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    Element* orow = out + row * p.o_row_stride + (lane % 4) * 2;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<uint32_t*>(orow + j * 8) =
          pack_x2<Element>(o[j * 4 + 2 * r] * inv, o[j * 4 + 2 * r + 1] * inv);
    if (lane % 4 == 0)
      lse[row] = sum == 0.f ? -INFINITY : row_max[r] * scale_log2 * 0.6931471805599453f + logf(sum);
  }
}

}  // namespace flashattn::sm90
