// Host side of the sm80 backward for one (head-dim bucket, dtype): the argument block,
// then preprocessing -> main kernel -> conversions, all on `stream`.
#pragma once
#include <stdexcept>
#include <string>
#include <cuda_runtime_api.h>
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include "../common/cuda_check.h"
#include "../common/params.h"
#include "kernel_bwd_aux_sm80.cuh"
#include "kernel_bwd_sm80.cuh"
#include "tile_bwd_sm80.h"

namespace flashattn::sm80 {

namespace bwd_detail {

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
inline bool strides_mod(int64_t a, int64_t b, int64_t c, int m) {
  return a % m == 0 && b % m == 0 && c % m == 0;
}

inline int convert_grid(int64_t work) {
  const int64_t blocks = (work + 255) / 256;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, 4096)));
}

// Deterministic rotation chunk: the SM count, capped by FLASHATTN_BWD_DET_CHUNK if set (the
// tests exercise several chunks on small shapes).
inline int det_rotation_chunk() {
  return env_capped("FLASHATTN_BWD_DET_CHUNK", "key blocks",
                    current_device_attribute(cudaDevAttrMultiProcessorCount));
}

}  // namespace bwd_detail

// A main kernel in place of this file's (the sm90 backward's, under development: its
// self-test runs it between this preprocessing and these conversions).
using BwdMainLaunch = void (*)(const BwdArgs&, cudaStream_t);

// One tile shape on a workspace laid out as `ws` (run_bwd_hdim picks both). heavy_first:
// causal, non-deterministic calls launch the longest key blocks first (H200, d128 causal:
// 2k 213 -> 223, 8k 266 -> 280 TFLOP/s; d64 causal 8k 243 -> 248; others unchanged).
// kSm80Main false: main_launch always runs in place of this file's main kernel, which is
// then not instantiated (the sm90 backward's translation units).
template <typename Tile, typename Element, bool kSm80Main = true>
void run_bwd_tile(const BwdParams& params, cudaStream_t stream, const BwdWorkspaceLayout& ws,
                  bool heavy_first = false, BwdMainLaunch main_launch = nullptr) {
  using namespace bwd_detail;
  constexpr int kHeadDim = Tile::kHeadDim;
  const BwdParams& p = params;
  if (p.batch == 0 || p.nheads == 0 || p.total_q == 0 || p.total_k == 0) return;
  check_grid_heads_batch(p.nheads, p.batch, "flashattn sm80 bwd");
  // Varlen with max_seqlen 0: no sequence has rows; only the conversions run (zeros).
  const bool empty = p.seqlen_q == 0 || p.seqlen_k == 0;
  // This tile's key blocks (the grid); the semaphore arrays must hold at least its blocks.
  // Extents: max_seqlen, or a block-sparse varlen mask's rows (seqlen.h).
  const bool sparse = p.q_num_blocks != nullptr;
  const int rows_q = mask_rows_q(p, sparse), rows_k = mask_rows_k(p, sparse);
  const int n_blocks = (rows_k + Tile::kBlockN - 1) / Tile::kBlockN;
  if (ws.n_blocks < n_blocks || ws.m_blocks < (rows_q + Tile::kBlockM - 1) / Tile::kBlockM)
    throw std::runtime_error("flashattn sm80 bwd: workspace laid out for larger blocks");

  BwdArgs args{};
  args.p = p;
  args.dq_accum = p.workspace_f32 + ws.dq_accum;
  args.dk_accum = ws.dk_accum >= 0 ? p.workspace_f32 + ws.dk_accum : nullptr;
  args.dv_accum = ws.dv_accum >= 0 ? p.workspace_f32 + ws.dv_accum : nullptr;
  args.dq_sem = ws.dq_sem >= 0 ? p.workspace_i32 + ws.dq_sem : nullptr;
  args.dkv_sem = ws.dkv_sem >= 0 ? p.workspace_i32 + ws.dkv_sem : nullptr;
  args.group = p.nheads / p.nheads_k;
  args.m_blocks = ws.m_blocks;  // dq_sem stride
  args.n_blocks = n_blocks;
  args.aligned_in =
      aligned16(p.q_ptr) && aligned16(p.k_ptr) && aligned16(p.v_ptr) && aligned16(p.do_ptr) &&
      strides_mod(p.q_batch_stride, p.q_row_stride, p.q_head_stride, 8) &&
      strides_mod(p.k_batch_stride, p.k_row_stride, p.k_head_stride, 8) &&
      strides_mod(p.v_batch_stride, p.v_row_stride, p.v_head_stride, 8) &&
      strides_mod(p.do_batch_stride, p.do_row_stride, p.do_head_stride, 8);
  args.aligned_o =
      aligned16(p.o_ptr) && strides_mod(p.o_batch_stride, p.o_row_stride, p.o_head_stride, 8);
  auto al4 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4 == 0; };
  args.pair_out = al4(p.dq_ptr) && al4(p.dk_ptr) && al4(p.dv_ptr) &&
                  strides_mod(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, 2) &&
                  strides_mod(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, 2) &&
                  strides_mod(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, 2);

  args.heavy_first = heavy_first && !p.deterministic &&
                     heavy_first_ok(p.window_left, p.window_right,
                                    int64_t(n_blocks) * p.nheads * p.batch);
  // Rotated visiting order without a window. Deterministic mode then waits on CTAs with
  // higher linear indices within a rotation chunk: chunks of at most one CTA per SM.
  args.rotate = p.window_left < 0 && p.window_right < 0 && p.q_num_blocks == nullptr;
  args.rot_chunk = p.deterministic ? det_rotation_chunk() : n_blocks;

  const int smem_optin = smem_optin_bytes();
  if (!empty && smem_optin < Tile::kSmemBytes)  // d256 on sm_86 / sm_89 (99 KB): no tile yet
    throw std::runtime_error("flashattn sm80 bwd: head dim " + std::to_string(kHeadDim) +
                             " needs " + std::to_string(Tile::kSmemBytes) +
                             " bytes of shared memory per block, this GPU allows " +
                             std::to_string(smem_optin));

  // (1) D = rowsum(dO * O).
  if (!empty) {
    dim3 grid((rows_q + 31) / 32, p.nheads, p.batch);
    bwd_preprocess_kernel<kHeadDim, Element><<<grid, 256, 0, stream>>>(args);
    FLASHATTN_LAUNCH_CHECK();
  }
  // (1b) The sink's gradient, in a fixed order (bitwise reproducible).
  if (!empty && p.dsink_ptr != nullptr) {
    bwd_dsink_kernel<Element><<<p.nheads, kDsinkThreads, 0, stream>>>(p);
    FLASHATTN_LAUNCH_CHECK();
  }
  // (2) The main kernel.
  if (!empty) {
    if (main_launch != nullptr || !kSm80Main) {
      main_launch(args, stream);
    } else if constexpr (kSm80Main) {
      dim3 grid(n_blocks, p.nheads, p.batch);
      constexpr int kSmem = Tile::kSmemBytes;
      auto launch = [&](auto kernel) {
        if (kSmem > 48 * 1024)
          FLASHATTN_CUDA_CHECK(
              set_max_dynamic_smem(kernel, kSmem));
        kernel<<<grid, Tile::kThreads, kSmem, stream>>>(args, 0);
        FLASHATTN_LAUNCH_CHECK();
      };
      if (p.q_num_blocks != nullptr) {
#ifdef FLASHATTN_DISABLE_BLOCK_SPARSE
        throw std::runtime_error("flashattn sm80 bwd: built with FLASHATTN_DISABLE_BLOCK_SPARSE");
#else
        // Block-sparse: nesting block sizes list whole kernel query blocks per mask query
        // block past the tiles in smem; any other (multiples of 16) the unit path, a 64-bit
        // unit mask per kernel query tile besides (bwd_main_kernel).
        const bool nests = p.block_m % Tile::kBlockM == 0 && p.block_n % Tile::kBlockN == 0;
        if (p.deterministic)
          throw std::runtime_error("flashattn sm80 bwd: block-sparse with deterministic=True "
                                   "is not built");
        const int64_t q_tiles =
            (int64_t(p.n_qblocks) * p.block_m + Tile::kBlockM - 1) / Tile::kBlockM;
        const int64_t cap = nests ? int64_t(p.n_qblocks) * (p.block_m / Tile::kBlockM) : q_tiles;
        const int64_t smem =
            Tile::kSmemBytes + (nests ? 4 * cap : ((4 * cap + 7) & ~int64_t(7)) + 8 * cap);
        if (smem > smem_optin)
          throw std::runtime_error("flashattn sm80 bwd: block-sparse over " +
                                   std::to_string(p.seqlen_q) + " query rows needs " +
                                   std::to_string(smem) + " bytes of shared memory, above the "
                                   "GPU's " + std::to_string(smem_optin));
        auto sparse = [&](auto kernel) {
          FLASHATTN_CUDA_CHECK(set_max_dynamic_smem(kernel, static_cast<int>(smem)));
          kernel<<<grid, Tile::kThreads, static_cast<size_t>(smem), stream>>>(
              args, static_cast<int>(cap));
          FLASHATTN_LAUNCH_CHECK();
        };
#ifndef FLASHATTN_DISABLE_DROPOUT
        if (p.dropout_threshold > 0) sparse(bwd_main_kernel<Tile, Element, false, true, true>);
        else
#endif
          sparse(bwd_main_kernel<Tile, Element, false, false, true>);
#endif  // FLASHATTN_DISABLE_BLOCK_SPARSE
      } else if (p.dropout_threshold > 0) {  // softcap switched inside
#ifndef FLASHATTN_DISABLE_DROPOUT
        launch(bwd_main_kernel<Tile, Element, false, true>);
#else
        throw std::runtime_error("flashattn sm80 bwd: built with FLASHATTN_DISABLE_DROPOUT");
#endif
      } else
#ifndef FLASHATTN_DISABLE_SOFTCAP
      if (p.softcap > 0.f)
        launch(bwd_main_kernel<Tile, Element, true>);
      else
#else
      if (p.softcap > 0.f)
        throw std::runtime_error("flashattn sm80 bwd: built with FLASHATTN_DISABLE_SOFTCAP");
#endif
        launch(bwd_main_kernel<Tile, Element, false>);
    }
  }
  // (3) dQ (scaled here), and dK / dV of GQA / MQA; zeros for varlen rows past the last
  // sequence when dK / dV are written directly.
  const bool aligned_dq = aligned16(p.dq_ptr) &&
                          strides_mod(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, 8);
  const bool aligned_dk = aligned16(p.dk_ptr) &&
                          strides_mod(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, 8);
  const bool aligned_dv = aligned16(p.dv_ptr) &&
                          strides_mod(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, 8);
  const int64_t seq_q = p.is_varlen ? 0 : p.seqlen_q, seq_k = p.is_varlen ? 0 : p.seqlen_k;
  {
    const int64_t work = p.total_q * p.nheads * (kHeadDim / 8);
    bwd_convert_kernel<kHeadDim, Element><<<convert_grid(work), 256, 0, stream>>>(
        args.dq_accum, static_cast<Element*>(p.dq_ptr), p.total_q, p.nheads, p.headdim, seq_q,
        p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, p.softmax_scale, 0, nullptr,
        aligned_dq);
    FLASHATTN_LAUNCH_CHECK();
  }
  if (args.group > 1 || p.is_varlen || empty) {
    const int64_t work = p.total_k * p.nheads_k * (kHeadDim / 8);
    const int32_t* cu_end = (args.group > 1 || empty) ? nullptr : p.cu_seqlens_k + p.batch;
    bwd_convert_kernel<kHeadDim, Element><<<convert_grid(work), 256, 0, stream>>>(
        args.dk_accum, static_cast<Element*>(p.dk_ptr), p.total_k, p.nheads_k, p.headdim,
        seq_k, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, 1.f, 0, cu_end,
        aligned_dk);
    FLASHATTN_LAUNCH_CHECK();
    bwd_convert_kernel<kHeadDim, Element><<<convert_grid(work), 256, 0, stream>>>(
        args.dv_accum, static_cast<Element*>(p.dv_ptr), p.total_k, p.nheads_k, p.headdim_v,
        seq_k, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, 1.f, 0, cu_end,
        aligned_dv);
    FLASHATTN_LAUNCH_CHECK();
  }
}

template <int kHeadDim, typename Element>
void run_bwd_hdim(const BwdParams& params, cudaStream_t stream) {
  using Default = typename BwdTileFor<kHeadDim>::type;
  using Large = typename BwdTileLargeSmem<kHeadDim>::type;
  using Small = typename BwdTileSmallSmem<kHeadDim>::type;
  constexpr int kMinM = bwd_block_m(kHeadDim), kMinN = bwd_block_n(kHeadDim);
  static_assert(Default::kBlockM >= kMinM && Large::kBlockM >= kMinM && Small::kBlockM >= kMinM &&
                    Default::kBlockN >= kMinN && Large::kBlockN >= kMinN &&
                    Small::kBlockN >= kMinN,
                "the workspace is sized by bwd_block_m / bwd_block_n (tile_bwd_sm80.h)");
  const BwdWorkspaceLayout ws = bwd_workspace_layout(params, kHeadDim);
  const int smem = smem_optin_bytes();
  // d256 causal below 2k keys: one head's key blocks together beat heavy-first (H200,
  // `selftest_bwd --tiles256`, TFLOP/s: N 512 108 -> 124, 1k 133 -> 159; 2k 191 vs 186).
  const bool heavy = kHeadDim < 256 || params.seqlen_k >= 2048;
  if constexpr (!std::is_same_v<Default, Large>) {
    if (smem >= Large::kSmemBytes) return run_bwd_tile<Large, Element>(params, stream, ws, heavy);
  }
  if constexpr (!std::is_same_v<Default, Small>) {
    if (smem < Default::kSmemBytes) return run_bwd_tile<Small, Element>(params, stream, ws, heavy);
  }
  run_bwd_tile<Default, Element>(params, stream, ws, heavy);
}

}  // namespace flashattn::sm80
