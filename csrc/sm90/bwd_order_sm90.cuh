// The launch order of the Hopper backward's CTAs (one per key block of a (head, sequence)):
// the section order of bwd_section_pairs (a section's pairs' key blocks in index order, the
// section's Q, dO and dQ kept in L2), and for block-sparse calls a heavy-first permutation of
// it made on the device before the main kernel (bwd_sparse_order_kernel).
//
// Why (benchmarks/NOTES.md, "Issue 16's worst cells"): a local + global mask gives the "global"
// key blocks every query block (256 steps at 32k) and a band block ~7. In section order head
// h's heavy CTAs start after the light CTAs of the heads before it, and the last head's end
// the kernel alone (~2.4 ms where the work over 132 SMs is ~1.1 ms). Heaviest first, the heavy
// CTAs run beside the light ones from the start.
#pragma once
#include <cstdint>

#include "../common/params.h"
#include "bwd_layout_sm90.h"  // bwd_det_n_block

namespace flashattn::sm90 {

// The coordinates of position `lin` of the section order over a grid of nb key blocks x heads
// x (pairs / heads) sequences; sect <= 0: one (head, sequence) pair after another.
__host__ __device__ __forceinline__ void bwd_coord_of(int64_t lin, int sect, int nb, int heads,
                                                      int pairs, int& n_block, int& h, int& b) {
  if (sect <= 0) {
    n_block = static_cast<int>(lin % nb);
    const int pair = static_cast<int>(lin / nb);
    h = pair % heads;
    b = pair / heads;
    return;
  }
  const int64_t span = int64_t(sect) * nb;
  const int s = static_cast<int>(lin / span), w = static_cast<int>(lin % span);
  const int here = sect < pairs - s * sect ? sect : pairs - s * sect;  // the last may be short
  const int pair = s * sect + w % here;
  n_block = w / here;
  h = pair % heads;
  b = pair / heads;
}

// The grid is (key blocks, heads, batch). Without an order: the section order (sect > 0) or
// the grid's own. With one (block-sparse calls): this CTA's position in the section order is
// order[linear index] (clamped into the grid). kDet and det_diag (deterministic calls with the
// diagonal dQ order, bwd_layout_sm90.h): the key blocks of each pair from the last down.
// (A template flag: an if on a constant false still changed the other kernels' SASS.)
template <bool kDet = false>
__device__ __forceinline__ void bwd_block_coord(int sect, int& n_block, int& h, int& b,
                                                const int* order = nullptr,
                                                bool det_diag = false) {
  n_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (sect <= 0 && order == nullptr) {
    if constexpr (kDet)
      if (det_diag) n_block = bwd_det_n_block(n_block, gridDim.x, true);
    return;
  }
  const int nb = gridDim.x, heads = gridDim.y, pairs = gridDim.y * gridDim.z;
  int64_t lin = blockIdx.x + int64_t(nb) * (blockIdx.y + int64_t(heads) * blockIdx.z);
  if (order != nullptr) {
    const int64_t v = order[lin], last = int64_t(nb) * pairs - 1;
    lin = v < 0 ? 0 : v > last ? last : v;
  }
  bwd_coord_of(lin, sect, nb, heads, pairs, n_block, h, b);
  if constexpr (kDet)
    if (det_diag) n_block = bwd_det_n_block(n_block, nb, true);
}

// Block-sparse calls: the query tiles of the mask that key block n_block (of kbn keys) of
// (b, h) lists (params.h's transposed view, clamped as the kernels clamp it).
__device__ __forceinline__ int bwd_sparse_weight(const BwdParams& p, int kbn, int n_block, int h,
                                                 int b) {
  const int64_t kb = int64_t(n_block) * kbn / p.block_n;
  if (kb >= p.n_kblocks) return 0;
  const int v = p.q_num_blocks[b * p.bs_t_batch_stride + h * p.bs_t_head_stride + kb];
  return v < 0 ? 0 : v > p.n_qblocks ? p.n_qblocks : v;
}

// Coarse weight classes: 0 for an empty list, else floor(log2(weight)) + 1.
__device__ __forceinline__ int bwd_weight_bin(int w) { return w <= 0 ? 0 : 32 - __clz(w); }

// Orders above this many CTAs keep the section order (one CTA's passes over them would cost
// more than the imbalance they mend).
inline constexpr int64_t kBwdOrderMaxCtas = int64_t(1) << 18;
inline constexpr int kBwdOrderThreads = 1024;

// One CTA: order[i] = the section-order position of the i-th CTA to launch. Where the heaviest
// key block lists at least twice the mean (and 4 tiles), the weight classes heaviest first,
// each in section order (stable: random masks, whose lists are alike, keep the L2 sections);
// else the section order itself. Every entry of order[0, nb * pairs) is written.
// (A template: headers define it in several translation units.)
template <int kThreads = kBwdOrderThreads>
__global__ void __launch_bounds__(kThreads)
    bwd_sparse_order_kernel(const __grid_constant__ BwdParams p, int kbn, int sect, int nb,
                            int heads, int pairs, int* __restrict__ order) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kWarps == 32, "one warp scans the warps' sums");
  __shared__ int s_max, s_scan[kWarps];
  __shared__ unsigned s_bins;
  __shared__ unsigned long long s_sum;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t total = int64_t(nb) * pairs;
  const int64_t per = (total + kThreads - 1) / kThreads;
  const int64_t lo = t * per < total ? t * per : total, hi = lo + per < total ? lo + per : total;
  auto weight = [&](int64_t lin) {
    int n_block, h, b;
    bwd_coord_of(lin, sect, nb, heads, pairs, n_block, h, b);
    return bwd_sparse_weight(p, kbn, n_block, h, b);
  };
  if (t == 0) s_max = 0, s_sum = 0, s_bins = 0;
  __syncthreads();
  int mx = 0;
  unsigned long long sum = 0;
  unsigned bins = 0;
  for (int64_t lin = lo; lin < hi; ++lin) {
    const int w = weight(lin);
    mx = w > mx ? w : mx;
    sum += static_cast<unsigned>(w);
    bins |= 1u << bwd_weight_bin(w);
  }
  for (int o = 16; o > 0; o /= 2) {
    const int m2 = __shfl_xor_sync(0xffffffffu, mx, o);
    mx = m2 > mx ? m2 : mx;
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    bins |= __shfl_xor_sync(0xffffffffu, bins, o);
  }
  if (lane == 0) atomicMax(&s_max, mx), atomicAdd(&s_sum, sum), atomicOr(&s_bins, bins);
  __syncthreads();
  const bool reorder = s_max >= 4 && static_cast<unsigned long long>(s_max) * total >= 2 * s_sum;
  if (!reorder) {
    for (int64_t lin = lo; lin < hi; ++lin) order[lin] = static_cast<int>(lin);
    return;
  }
  const unsigned present = s_bins;
  int64_t base = 0;  // positions taken by the heavier classes
  for (int bin = 31; bin >= 0; --bin) {
    if (!((present >> bin) & 1u)) continue;  // uniform across the CTA
    int cnt = 0;
    for (int64_t lin = lo; lin < hi; ++lin) cnt += bwd_weight_bin(weight(lin)) == bin;
    int incl = cnt;  // the block's inclusive scan of cnt, in thread order
    for (int o = 1; o < 32; o *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) s_scan[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      int x = s_scan[lane];
      for (int o = 1; o < 32; o *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += v;
      }
      s_scan[lane] = x;
    }
    __syncthreads();
    int64_t pos = base + (warp > 0 ? s_scan[warp - 1] : 0) + incl - cnt;
    // At most the cnt slots counted above: a mask rewritten between the two passes (another
    // stream) could otherwise write past them, even past the workspace (a review's hardening;
    // slots left unwritten then hold any value, which bwd_block_coord clamps).
    const int64_t end = pos + cnt;
    for (int64_t lin = lo; lin < hi; ++lin)
      if (bwd_weight_bin(weight(lin)) == bin && pos < end) order[pos++] = static_cast<int>(lin);
    base += s_scan[kWarps - 1];
    __syncthreads();  // s_scan is rewritten by the next class
  }
}

}  // namespace flashattn::sm90
