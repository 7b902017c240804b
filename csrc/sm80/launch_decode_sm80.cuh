// Host side of the split-KV decode kernel (kernel_decode_sm80.cuh): the plan (row tiles, key
// splits, variant) and the launches. run_decode_hdim is instantiated once per (head-dim
// bucket, dtype) in csrc/instantiations/decode_sm80_hdim*_*.cu; decode_sm80.cu dispatches.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../common/cuda_check.h"
#include "../common/params.h"
#include "kernel_decode_sm80.cuh"
#include "launch_fwd_sm80.cuh"  // fwd_vectorizable

namespace flashattn::sm80 {

struct DecodePlan {
  int warps_m = 1;      // 16-row warp groups of a tile (1, 2 or 4)
  int m_tiles = 0;      // row tiles per (batch, KV head)
  int num_splits = 1;   // key splits (grid.y)
  bool small_smem = false;
  int64_t rows_total = 0;  // nheads * total_q
  int dv_pitch = 0;
  int64_t workspace_f32 = 0;  // partial outputs + their LSEs (0 when num_splits is 1)
};

// Rows of a tile: the tokens x query heads of one KV head; tiles of 16, 32 or 64 rows. Splits
// (num_splits 0): as many as fit the (batch, KV head, row tile) CTAs into one wave of resident
// CTAs (two per SM, one at d > 128), each split at least one block, at most 128; 1 once those
// CTAs alone fill a wave. (A split count rounded up, 1.2 waves, left the last wave's SMs idle:
// H200, batch 8 x 16k, 2.36 TB/s.)
inline DecodePlan decode_plan(const FwdParams& p, int bucket) {
  DecodePlan pl;
  const int group = p.nheads / p.nheads_k;
  const int64_t rows = int64_t(p.seqlen_q) * group;
  pl.warps_m = rows <= 16 ? 1 : (rows <= 32 ? 2 : 4);
  const bool big = bucket > 128;
  // The default tiles' shared memory (DecodeTraits' defaults: 64-key stages, a ~96 KB ring);
  // where the device has less (sm_86 / sm_89: 99 KB, from d 96 on), the small variant.
  const int default_smem = decode_smem_bytes(16 * pl.warps_m, bucket, 64, 98304);
  pl.small_smem = smem_optin_bytes() < default_smem;
  if (pl.small_smem) pl.warps_m = 4;
  const int tile_m = 16 * pl.warps_m;
  pl.m_tiles = static_cast<int>((rows + tile_m - 1) / tile_m);
  const int64_t ctas = int64_t(p.batch) * p.nheads_k * pl.m_tiles;
  if (ctas > 0x7fffffff) throw std::runtime_error("flashattn decode: too many row tiles");
  const int block_n = pl.small_smem ? 32 : 64;
  const int64_t blocks = std::max<int64_t>(1, (int64_t(p.seqlen_k) + block_n - 1) / block_n);
  if (p.num_splits > 0) {
    pl.num_splits = static_cast<int>(std::min<int64_t>({p.num_splits, blocks, 256}));
  } else {
    const int64_t slots = (big ? 1LL : 2LL) *
                          current_device_attribute(cudaDevAttrMultiProcessorCount);
    pl.num_splits = ctas >= slots ? 1
                                  : static_cast<int>(std::min<int64_t>({slots / ctas, blocks, 128}));
  }
  pl.rows_total = int64_t(p.nheads) * p.total_q;
  pl.dv_pitch = (p.headdim_v + 3) / 4 * 4;
  if (pl.num_splits > 1) pl.workspace_f32 = pl.num_splits * pl.rows_total * (pl.dv_pitch + 1);
  return pl;
}

template <typename T>
void launch_decode(const FwdParams& p, const DecodePlan& pl, const DecodeArgs& a,
                   cudaStream_t stream) {
  auto kernel = decode_kernel_sm80<T>;
  constexpr int kSmem = T::kSmem;
  if (kSmem > smem_optin_bytes())
    throw std::runtime_error("flashattn decode: the kernel needs " + std::to_string(kSmem) +
                             " bytes of shared memory per block, the device allows " +
                             std::to_string(smem_optin_bytes()));
  if constexpr (kSmem > 48 * 1024) {
    FLASHATTN_CUDA_CHECK(
        set_max_dynamic_smem(kernel, kSmem));
  }
  const dim3 grid(static_cast<unsigned>(int64_t(p.batch) * p.nheads_k * pl.m_tiles),
                  static_cast<unsigned>(pl.num_splits));
  kernel<<<grid, T::kThreads, kSmem, stream>>>(p, a);
  FLASHATTN_LAUNCH_CHECK();
}

template <int kHeadDim, typename Element>
void run_decode_hdim(const FwdParams& p, cudaStream_t stream) {
  const DecodePlan pl = decode_plan(p, kHeadDim);
  if (pl.num_splits > 1 && (p.workspace_f32 == nullptr || p.workspace_f32_elems < pl.workspace_f32))
    throw std::runtime_error("flashattn decode: the workspace is smaller than "
                             "fwd_kvcache_workspace asked for");
  DecodeArgs a;
  a.group = p.nheads / p.nheads_k;
  a.m_tiles = pl.m_tiles;
  a.rows_total = pl.rows_total;
  a.dv_pitch = pl.dv_pitch;
  a.page_shift = -1;
  if (p.block_table != nullptr && p.page_size > 0 && (p.page_size & (p.page_size - 1)) == 0)
    for (a.page_shift = 0; (1 << a.page_shift) < p.page_size;) ++a.page_shift;
  a.vec_ok = fwd_vectorizable(p);
  a.fast = a.vec_ok && p.headdim == kHeadDim && p.headdim_v == kHeadDim;
  a.score_mod = p.softcap > 0.f || p.alibi_slopes != nullptr || !(p.softmax_scale > 0.f);
  // On Hopper and later the combine is a programmatic dependent launch of the split kernel
  // (its launch under the split kernel; CUDA graphs keep the edge), unless
  // FLASHATTN_DECODE_PDL=0 (read per call). On an H100 in CUDA graphs: 1.01-1.04x alone,
  // 1.02-1.24x with the cta combine (2026-12-07,
  // benchmarks/results/h100_decode_combine_5fc040a.txt).
  const char* pdl_env = std::getenv("FLASHATTN_DECODE_PDL");
  a.pdl = pl.num_splits > 1 && !(pdl_env != nullptr && std::strcmp(pdl_env, "0") == 0) &&
          current_device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
  if (pl.small_smem) {
    launch_decode<DecodeSmallSmem<kHeadDim, Element>>(p, pl, a, stream);
  } else {
    switch (pl.warps_m) {
      case 1: launch_decode<DecodeTraits<kHeadDim, Element, 1>>(p, pl, a, stream); break;
      case 2: launch_decode<DecodeTraits<kHeadDim, Element, 2>>(p, pl, a, stream); break;
      default: launch_decode<DecodeTraits<kHeadDim, Element, 4>>(p, pl, a, stream); break;
    }
  }
  if (pl.num_splits > 1) {
    static_assert(4 * 64 >= kHeadDim, "the cta combine covers value dims up to 256");
    const int64_t blocks = (pl.rows_total + 3) / 4;  // the serial loop: 4 rows a CTA
    if (pl.rows_total > 0x7fffffff) throw std::runtime_error("flashattn decode: too many rows");
    // The combine (kernel_decode_sm80.cuh): one CTA per row, or the serial warp-per-row
    // loop with FLASHATTN_DECODE_COMBINE=serial (read per call, for A/B runs).
    const char* comb = std::getenv("FLASHATTN_DECODE_COMBINE");
    const bool cta = !(comb != nullptr && std::strcmp(comb, "serial") == 0);
    constexpr int kCols = kHeadDim <= 64 ? 16 : (kHeadDim <= 128 ? 32 : 64);
    auto combine = cta ? decode_combine_cta_kernel<Element, kCols>
                       : decode_combine_kernel<Element>;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(cta ? pl.rows_total : blocks));
    cfg.blockDim = dim3(cta ? 256 : 128);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = a.pdl ? 1 : 0;
    FLASHATTN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, combine, p, a, pl.num_splits));
  }
}

}  // namespace flashattn::sm80
