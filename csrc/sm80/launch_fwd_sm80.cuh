// Host side of the sm80 forward: picks the kernel variant for one (head-dim bucket, dtype)
// and launches it. Instantiated once per pair in csrc/instantiations/fwd_sm80_hdim*_*.cu.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../common/cuda_check.h"
#include "../common/params.h"
#include "kernel_fwd_sm80.cuh"

namespace flashattn::sm80 {

// True when every base pointer is 16-byte aligned and every stride a multiple of 8 elements,
// so that each 8-column chunk of every row can move as one 16-byte access.
inline bool fwd_vectorizable(const FwdParams& p) {
  auto al = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  auto st = [](int64_t s) { return s % 8 == 0; };
  return al(p.q_ptr) && al(p.k_ptr) && al(p.v_ptr) && al(p.o_ptr) && st(p.q_batch_stride) &&
         st(p.q_row_stride) && st(p.q_head_stride) && st(p.k_batch_stride) &&
         st(p.k_row_stride) && st(p.k_head_stride) && st(p.v_batch_stride) &&
         st(p.v_row_stride) && st(p.v_head_stride) && st(p.o_batch_stride) &&
         st(p.o_row_stride) && st(p.o_head_stride);
}

template <typename Traits, bool Is_even_K, bool Has_score_mod, bool Has_dropout = false>
void launch_fwd(const FwdParams& p, bool vec_ok, dim3 grid, cudaStream_t stream,
                bool heavy_first = false) {
  auto kernel = fwd_kernel_sm80<Traits, Is_even_K, Has_score_mod, Has_dropout>;
  constexpr int kSmem = Traits::kSmemBytes;
  if constexpr (kSmem > 48 * 1024) {
    FLASHATTN_CUDA_CHECK(
        set_max_dynamic_smem(kernel, kSmem));
  }
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(p, vec_ok, heavy_first, 0);
  FLASHATTN_LAUNCH_CHECK();
}

// Block-sparse (params.h): nesting block sizes (block_m a multiple of kBlockM, block_n of
// kBlockN) list whole kernel key blocks per mask key block (list_cap ints past the tiles);
// any other (multiples of 16) the kernel's unit path, a 64-bit unit mask per kernel key tile
// besides (fwd_kernel_sm80). Dropout is a run-time switch of the sparse kernel.
template <typename Traits>
void launch_fwd_sparse(const FwdParams& p, bool vec_ok, bool even_k, dim3 grid,
                       cudaStream_t stream, bool heavy_first) {
  const bool nests = p.block_m % Traits::kBlockM == 0 && p.block_n % Traits::kBlockN == 0;
  // Unit path: one list entry and one mask per kernel key tile of the mask's key range.
  const int64_t key_tiles =
      (int64_t(p.n_kblocks) * p.block_n + Traits::kBlockN - 1) / Traits::kBlockN;
  const int64_t cap = nests ? int64_t(p.n_kblocks) * (p.block_n / Traits::kBlockN) : key_tiles;
  const int64_t smem = Traits::kSmemBytes + (nests ? 4 * cap : ((4 * cap + 7) & ~int64_t(7)) + 8 * cap);
  if (smem > smem_optin_bytes())
    throw std::runtime_error("flashattn sm80 fwd: block-sparse over " +
                             std::to_string(p.seqlen_k) + " keys (block sizes " +
                             std::to_string(p.block_m) + ", " + std::to_string(p.block_n) +
                             ") needs " + std::to_string(smem) +
                             " bytes of shared memory, above the GPU's " +
                             std::to_string(smem_optin_bytes()));
  auto run = [&](auto kernel) {
    FLASHATTN_CUDA_CHECK(set_max_dynamic_smem(kernel, static_cast<int>(smem)));
    kernel<<<grid, Traits::kNThreads, static_cast<size_t>(smem), stream>>>(
        p, vec_ok, heavy_first, static_cast<int>(cap));
    FLASHATTN_LAUNCH_CHECK();
  };
  if (even_k) run(fwd_kernel_sm80<Traits, true, false, true, true>);
  else run(fwd_kernel_sm80<Traits, false, false, true, true>);
}

template <typename Traits>
void launch_fwd_variants(const FwdParams& p, cudaStream_t stream, int heavy_min_seqlen = 0) {
  // Block-sparse varlen: the mask's rows (seqlen.h), at least one block, whose last CTA
  // zeroes a sequence's rows past the grid (fwd_kernel_sm80).
  const bool sparse_varlen = p.kv_num_blocks != nullptr && p.is_varlen;
  const int64_t rows = mask_rows_q(p, p.kv_num_blocks != nullptr);
  const int64_t m_blocks =
      std::max<int64_t>(sparse_varlen ? 1 : 0, (rows + Traits::kBlockM - 1) / Traits::kBlockM);
  check_grid_heads_batch(p.nheads, p.batch, "flashattn sm80 fwd");
  if (m_blocks > 0x7fffffff) throw std::runtime_error("flashattn sm80 fwd: seqlen_q too large");
  const dim3 grid(static_cast<unsigned>(m_blocks), p.nheads, p.batch);
  const bool vec_ok = fwd_vectorizable(p);
  const bool even_k = vec_ok && p.headdim == Traits::kHeadDim && p.headdim_v == Traits::kHeadDim;
  // A non-positive scale would break max-then-scale: it takes the transformed-score path.
  const bool score_mod = p.softcap > 0.f || p.alibi_slopes != nullptr || !(p.softmax_scale > 0.f);
  // Causal (a right bound, no left one) gives later query blocks more keys: launch every
  // head's longest blocks first (H200, bf16: +3-10% at d 64-256, N 512-16k;
  // selftest_fwd_sm80). The kernel's linear block index is 32-bit: only below 2^31 blocks.
  const bool heavy_first = p.seqlen_q >= heavy_min_seqlen &&
      heavy_first_ok(p.window_left, p.window_right, m_blocks * p.nheads * p.batch);
  if (p.kv_num_blocks != nullptr) {
#ifndef FLASHATTN_DISABLE_BLOCK_SPARSE
    return launch_fwd_sparse<Traits>(p, vec_ok, even_k, grid, stream, heavy_first);
#else
    throw std::runtime_error("flashattn sm80 fwd: built with FLASHATTN_DISABLE_BLOCK_SPARSE");
#endif
  }
  // Dropout: one variant per Is_even_K (the score transform switched inside).
  if (p.dropout_threshold > 0) {
#ifndef FLASHATTN_DISABLE_DROPOUT
    if (even_k) launch_fwd<Traits, true, false, true>(p, vec_ok, grid, stream, heavy_first);
    else launch_fwd<Traits, false, false, true>(p, vec_ok, grid, stream, heavy_first);
    return;
#else
    throw std::runtime_error("flashattn sm80 fwd: built with FLASHATTN_DISABLE_DROPOUT");
#endif
  }
  if (even_k) {
    if (score_mod) launch_fwd<Traits, true, true>(p, vec_ok, grid, stream, heavy_first);
    else launch_fwd<Traits, true, false>(p, vec_ok, grid, stream, heavy_first);
  } else {
    if (score_mod) launch_fwd<Traits, false, true>(p, vec_ok, grid, stream, heavy_first);
    else launch_fwd<Traits, false, false>(p, vec_ok, grid, stream, heavy_first);
  }
}

template <int kHeadDim, typename Element>
void run_fwd_hdim(const FwdParams& p, cudaStream_t stream) {
  using Traits = FwdTraits<kHeadDim, Element>;
  constexpr FwdTile kSmall = fwd_tile_small_smem(kHeadDim);
  using SmallTraits = FwdTraits<kHeadDim, Element, kSmall.block_m, kSmall.block_n, kSmall.warps,
                                kSmall.stages, kSmall.min_blocks>;
  if (p.headdim < 1 || p.headdim > kHeadDim || p.headdim_v < 1 || p.headdim_v > kHeadDim)
    throw std::runtime_error("flashattn sm80 fwd: head dims (" + std::to_string(p.headdim) +
                             ", " + std::to_string(p.headdim_v) + ") exceed the bucket " +
                             std::to_string(kHeadDim));
  if (p.nheads_k < 1 || p.nheads % p.nheads_k != 0)
    throw std::runtime_error("flashattn sm80 fwd: nheads must be a multiple of nheads_k");
  // Block-sparse varlen with max_seqlen_q 0 still runs: its rows keep nothing (zeroed).
  const bool sparse_varlen = p.kv_num_blocks != nullptr && p.is_varlen;
  if ((p.seqlen_q <= 0 && !sparse_varlen) || p.batch <= 0 || p.nheads <= 0) return;
  // The smaller tile where the GPU's (or FLASHATTN_SMEM_LIMIT's) smem is below the primary's.
  constexpr bool kHasSmall = SmallTraits::kSmemBytes < Traits::kSmemBytes;
  constexpr int kNeed = kHasSmall ? SmallTraits::kSmemBytes : Traits::kSmemBytes;
  const int max_smem = smem_optin_bytes();
  if (max_smem < kNeed)
    throw std::runtime_error("flashattn sm80 fwd: head dim " + std::to_string(kHeadDim) +
                             " needs " + std::to_string(kNeed) +
                             " bytes of shared memory per block, this GPU allows " +
                             std::to_string(max_smem));
  if constexpr (kHasSmall) {
    if (max_smem < Traits::kSmemBytes) return launch_fwd_variants<SmallTraits>(p, stream);
    // d256 up to 2k keys: 64 x 64 (2 CTAs/SM) wastes less of the causal diagonal. H200
    // (--variants), causal TFLOP/s: N 512 182 -> 195 (per head), 1k 236 -> 245, 2k 273 -> 282.
    if (p.headdim == kHeadDim && p.headdim_v == kHeadDim && p.seqlen_q <= 2048 &&
        p.seqlen_k <= 2048)
      return launch_fwd_variants<SmallTraits>(p, stream, 1024);
  }
  launch_fwd_variants<Traits>(p, stream);
}

}  // namespace flashattn::sm80
