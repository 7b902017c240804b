// Host side of the Hopper backward's main kernel (kernel_bwd_sm90.cuh): what it
// takes, its tensor maps, the launch. The preprocessing and conversions around it are the sm80
// backward's (sm80/kernel_bwd_aux_sm80.cuh); tools/selftest/selftest_bwd_sm80.cu (built with
// -DSELFTEST_SM90) runs the three in order; run_bwd_hdim below is the package's (instantiated
// per head dim in csrc/instantiations/bwd_sm90_hdim*_*.cu, dispatched in dispatch_bwd_sm90.cu).
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../common/cuda_check.h"
#include "../common/tile_policy.h"
#include "kernel_bwd_sm90.cuh"
#include "../sm80/launch_bwd_sm80.cuh"  // the preprocessing and conversions around it
#include "launch_fwd_sm90.cuh"  // tensor_map, fwd_unsupported's TMA rules

namespace flashattn::sm90 {

// The sm90 dropout backward: on unless FLASHATTN_SM90_DROPOUT_BWD=0 (read per call: tests
// switch it), which sends dropout backwards to the sm80 kernels. Its tests passed on the H200
// (2026-12-03) and it ran 1.5-1.7x the sm80 dropout backward there (benchmarks/NOTES.md).
inline bool sm90_dropout_bwd_enabled() {
#ifdef FLASHATTN_DISABLE_DROPOUT
  return false;
#else
  return !env_is("FLASHATTN_SM90_DROPOUT_BWD", '0');
#endif
}

// A block mask (params.h) runs on the sm90 backward's Is_sparse kernel for padded calls
// without dropout whose blocks are whole kernel tiles: block_m a multiple of the bucket's
// kBM (64 at d128, 128 at d64), block_n of 128. The sm80 backward runs the others.
inline const char* bwd_sparse_unsupported(const BwdParams& p) {
  if (p.q_num_blocks == nullptr) return nullptr;
#if defined(FLASHATTN_DISABLE_BLOCK_SPARSE)
  return "a block mask (this build has no sm90 block-sparse kernels)";
#endif
  if (p.is_varlen) return "a block mask on varlen batches (not yet: the sm80 backward runs it)";
  if (p.dropout_threshold > 0)
    return "a block mask with dropout (not yet: the sm80 backward runs it)";
  const int bm = headdim_bucket(p.headdim, p.headdim_v) == 64 ? 128 : 64;
  if (p.block_m <= 0 || p.block_n <= 0 || p.block_m % bm != 0 || p.block_n % 128 != 0)
    return "a block mask whose blocks are not whole sm90 backward tiles (the sm80 backward "
           "runs it)";
  return nullptr;
}

// The sm90 backward's block-sparse list: the count and every kernel query tile of the mask.
inline int64_t bwd_sparse_list_cap(const BwdParams& p, int block_m) {
  return p.q_num_blocks == nullptr ? 0 : int64_t(p.n_qblocks) * (p.block_m / block_m);
}
inline int64_t bwd_sparse_smem_bytes(const BwdParams& p, int64_t cap) {
  return p.q_num_blocks != nullptr ? 4 * (cap + 1) : 0;
}

// The sm90 backward's deterministic variant (Is_det: bwd_dq_warp's and bwd_dkv_turn_*'s
// orders): on (tests, bitwise checks and memcheck passed on the H100, 2026-12-06; 0.66-1.01
// of the default backward there, the sm80 deterministic path ~0.5); FLASHATTN_SM90_DET_BWD=0
// (read per call) sends deterministic backwards to sm80.
inline bool sm90_det_bwd_enabled() { return !env_is("FLASHATTN_SM90_DET_BWD", '0'); }
// The deterministic backward's diagonal dQ order (bwd_layout_sm90.h: causal masks; FA3's
// order), on by default since its tests passed on an H100 (2026-12-07, eighth session, with the
// two dQ warps below: no hang, bitwise over two runs); FLASHATTN_SM90_DET_DIAG=0 (read per call)
// takes the index order. The index order ran d 256 causal at 0.64-0.82 of the default backward
// (every key block of a (head, sequence) adding at the same query block at the same step),
// with both switches 0.88-0.95 (benchmarks/NOTES.md, 2026-12-07 eighth session).
inline bool sm90_det_diag_call(const BwdParams& p) {
  return p.deterministic && bwd_det_diag(p.window_left, p.window_right) &&
         !env_is("FLASHATTN_SM90_DET_DIAG", '0');
}
// The deterministic backward's two dQ warps (bwd_dq_warp), on by default (as above);
// FLASHATTN_SM90_DET_DQ2=0 (read per call) keeps one: a block's adds complete while the other
// warp takes the next block. With one warp d 256 non-causal ran at 0.77-0.85 of the default
// (H100), as a model does where an add's completion (~4 us) outlasts a block's compute
// (~3.4 us; benchmarks/notes/det_order_model_20261207.py); with two 0.83-1.08.
inline int sm90_det_dq_warps(const BwdParams& p) {
  return p.deterministic && !env_is("FLASHATTN_SM90_DET_DQ2", '0') ? 2 : 1;
}

// The sm90 kernel (64, 128 or 256; 0: none) of a call's head-dim bucket: its own, and the
// buckets 96 and 192 (qk = v) on the next kernel up, its columns past the head dim zero (4 / 3
// the MMA work of a kernel of their own), 1.43-1.67x the sm80 backward at d 96 / 192 (H100,
// 2026-12-06; plain, softcap and ALiBi calls: dropout and deterministic calls there have not
// run on a GPU, so sm80 takes them); FLASHATTN_SM90_BWD_PAD=0 (read per call) sends all to sm80.
inline int sm90_bwd_kernel_dim(const BwdParams& p) {
  const int b = headdim_bucket(p.headdim, p.headdim_v);
  if (b == 64 || b == 128 || b == 256) return b;
  if (env_is("FLASHATTN_SM90_BWD_PAD", '0') || p.headdim != p.headdim_v ||
      p.dropout_threshold > 0 || p.deterministic)
    return 0;
  return b == 96 ? 128 : b == 192 ? 256 : 0;
}

// Softcap and / or ALiBi: the kernels' Has_score_mod variant (bwd_score_mod).
inline bool bwd_score_mod_call(const BwdParams& p) {
  return p.softcap > 0.f || p.alibi_slopes != nullptr;
}

// Why the sm90 backward's main kernel does not take this call (nullptr: it does).
inline const char* bwd_unsupported(const BwdParams& p, int kD) {
  FwdParams fwd = p;  // the forward's rules but its block-mask one (the backward's is below)
  fwd.kv_num_blocks = nullptr;
  if (const char* why = fwd_unsupported(fwd)) return why;
  if (p.dropout_threshold > 0 && !sm90_dropout_bwd_enabled())
    return "dropout (FLASHATTN_SM90_DROPOUT_BWD=0 turns the sm90 dropout backward off; the sm80 "
           "backward runs it)";
  if (const char* why = bwd_sparse_unsupported(p)) return why;
  // The fp32 accumulators' rows are kD long (bwd_workspace_layout of the kernel's bucket).
  if (sm90_bwd_kernel_dim(p) != kD)
    return "head dims outside the kernel's bucket (the accumulators' row length)";
  if (!(p.softmax_scale > 0.f)) return "a scale <= 0 (not yet)";
  if (bwd_score_mod_call(p) && (p.dropout_threshold > 0 || p.q_num_blocks != nullptr))
    return "softcap or ALiBi with dropout or a block mask (not yet: the sm80 backward runs it)";
  if (p.deterministic) {
    if (!sm90_det_bwd_enabled())
      return "deterministic=True under FLASHATTN_SM90_DET_BWD=0";
    if (p.dropout_threshold > 0 || bwd_score_mod_call(p) || p.q_num_blocks != nullptr)
      return "deterministic=True with dropout, softcap / ALiBi or a block mask (not yet: the "
             "sm80 backward runs it)";
  }
  if (!aligned_to(p.do_ptr, 16) ||
      !strides_ok(p.do_row_stride, p.do_head_stride, p.do_batch_stride, 8))
    return "dout not 16-byte aligned in base and strides (TMA)";
  if (!aligned_to(p.dk_ptr, 4) || !aligned_to(p.dv_ptr, 4) ||
      !strides_ok(p.dk_row_stride, p.dk_head_stride, p.dk_batch_stride, 2) ||
      !strides_ok(p.dv_row_stride, p.dv_head_stride, p.dv_batch_stride, 2))
    return "dk / dv not 4-byte aligned (element pairs are stored)";
  return nullptr;
}

// The fp32 dQ accumulator [rows][heads][kd] as boxes of 32 columns x 64 rows of one head,
// 128-byte swizzled (the kernel's shared dQ chunks); padded (batch > 0): 4-D (kd, seqlen, heads,
// batch) with row b * seqlen + i, varlen: 3-D over the packed rows. Adds past the extents drop.
inline CUtensorMap dq_accum_map(float* ptr, int kd, int64_t rows, int heads, int batch) {
  CUtensorMap m;
  const cuuint64_t row = cuuint64_t(heads) * kd * 4;
  const cuuint64_t dims[4] = {cuuint64_t(kd), cuuint64_t(rows), cuuint64_t(heads),
                              cuuint64_t(batch)};
  const cuuint64_t strides[3] = {row, cuuint64_t(kd) * 4, row * cuuint64_t(rows)};
  const cuuint32_t box[4] = {32, 64, 1, 1}, estr[4] = {1, 1, 1, 1};
  if (batch > 0 && strides[2] >= (cuuint64_t(1) << 40))
    throw std::runtime_error("flashattn sm90 bwd: dQ accumulator batch stride >= 2^40 bytes");
  const CUresult r = tensor_map_encoder()(
      &m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, batch == 0 ? 3 : 4, ptr, dims, strides, box, estr,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("flashattn sm90 bwd: cuTensorMapEncodeTiled (dQ) failed (" +
                             std::to_string(int(r)) + ")");
  return m;
}

// Launch order of the key blocks (bwd_block_coord): kAuto takes L2 sections of (head,
// sequence) pairs, heaviest blocks first, when the blocks are unequal (causal); kPerHead always
// one pair after another (the self-test times both).
enum class BwdOrder { kAuto, kPerHead };

// Block-sparse calls one (head, sequence) pair after another (sect 0: all key blocks of a
// pair adjacent in the launch order, so that they run at the same time) instead of in L2
// sections whose pairs take turns key block by key block (the default since 2026-12-07;
// FLASHATTN_SM90_SPARSE_PAIRS=0, read per call, keeps the sections). H100 A/B in one process
// (results/h100_det_call_4701b26.txt), backward TFLOP/s over the sections: random25 d 64 /
// 128 at 2k 1.026 / 1.052, 8k 1.025 / 1.035; random50 1.027 / 1.047, 1.003 / 0.996;
// local_global 1.159 / 1.012, 0.990 / 1.125. Why: ncu of the 2k random25 d 128
// backward (H100) read 791 MB from DRAM where the dense call of the same shape reads 409, an
// L2 hit rate of 55% against 88%. The likely cause: a section's 16 pairs x 16 key blocks fill
// two waves of CTAs, so each pair's key blocks run in two waves and its Q, dO and dQ lines are
// fetched again in the second; the dense walk shares each fetch among the 8 key blocks of a
// wave in lockstep, the sparse one among the ~2 of them that keep the block.
inline bool sm90_sparse_pair_order() { return !env_is("FLASHATTN_SM90_SPARSE_PAIRS", '0'); }

// Pairs per section: as many as keep their Q, dO and dQ accumulator in 80% of L2 (a power of
// two, as FA3 found faster), at least 1; 0 for the per-pair order.
// A block mask takes the section order whatever its window: a key block kept by many query
// blocks (local + global masks: the global keys, kept by every query block) is heaviest, and
// masks put those first far more often than last; one head after another would leave the last
// heads' heavy key blocks to end the kernel alone.
inline int bwd_section_pairs(const BwdParams& p, int kd, BwdOrder order) {
  if (order == BwdOrder::kPerHead ||
      (!heavy_first_ok(p.window_left, p.window_right, 0) && p.q_num_blocks == nullptr) ||
      (p.q_num_blocks != nullptr && sm90_sparse_pair_order()))
    return 0;
  const int64_t per_pair =
      int64_t(p.seqlen_q) * ((int64_t(p.headdim) + p.headdim_v) * 2 + int64_t(kd) * 4);
  const int64_t l2 = int64_t(current_device_attribute(cudaDevAttrL2CacheSize)) * 4 / 5;
  int sect = 1;
  while (int64_t(sect) * 2 * per_pair <= l2 && int64_t(sect) * 2 <= int64_t(p.nheads) * p.batch)
    sect *= 2;
  return sect;
}

// The block-sparse backward's heavy-first launch order (bwd_order_sm90.cuh; written
// 2026-12-06, fourth session): on; FLASHATTN_SM90_SPARSE_ORDER=0 keeps the section order (read
// per call, for the A/B).
inline bool sm90_sparse_order_enabled() { return !env_is("FLASHATTN_SM90_SPARSE_ORDER", '0'); }

// Block-sparse calls (never deterministic on sm90: bwd_unsupported): the int32 workspace
// entries, past the sm80 layout's, that hold the CTAs' launch order (bwd_order_sm90.cuh): one
// per CTA of the 64 / 128 kernel's grid (kBN = 128 keys; the d 256 kernel takes no mask); 0
// for other calls and for grids past kBwdOrderMaxCtas (those keep the section order).
inline int64_t bwd_order_entries(const BwdParams& p) {
  constexpr int kBN = BwdConfigFor<128>::kBN;
  static_assert(BwdConfigFor<64>::kBN == kBN, "one key tile for both kernels");
  if (p.q_num_blocks == nullptr || p.deterministic || p.seqlen_k <= 0) return 0;
  const int64_t n = (int64_t(p.seqlen_k) + kBN - 1) / kBN * p.nheads * p.batch;
  return n <= kBwdOrderMaxCtas ? n : 0;
}

// The tensor maps of a main kernel with kBM-query and kBN-key boxes over accumulators of kD
// columns (kernel_bwd_sm90.cuh's, kernel_bwd_d256_sm90.cuh's).
template <typename Element>
BwdMaps bwd_tensor_maps(const sm80::BwdArgs& args, int kD, int kBM, int kBN) {
  const BwdParams& p = args.p;
  const int64_t rows_q = p.is_varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = p.is_varlen ? p.total_k : p.seqlen_k;
  const int batch = p.is_varlen ? 0 : p.batch;
  if (!aligned_to(args.dq_accum, 16))
    throw std::runtime_error("flashattn sm90 bwd: dQ accumulator not 16-byte aligned (TMA)");
  return BwdMaps{
      tensor_map<Element>(p.q_ptr, p.headdim, rows_q, p.nheads, batch, p.q_row_stride,
                          p.q_head_stride, p.q_batch_stride, kBM),
      tensor_map<Element>(p.k_ptr, p.headdim, rows_k, p.nheads_k, batch, p.k_row_stride,
                          p.k_head_stride, p.k_batch_stride, kBN),
      tensor_map<Element>(p.v_ptr, p.headdim_v, rows_k, p.nheads_k, batch, p.v_row_stride,
                          p.v_head_stride, p.v_batch_stride, kBN),
      tensor_map<Element>(p.do_ptr, p.headdim_v, rows_q, p.nheads, batch, p.do_row_stride,
                          p.do_head_stride, p.do_batch_stride, kBM),
      dq_accum_map(args.dq_accum, kD, rows_q, p.nheads, batch)};
}

// The main kernel on args prepared as the sm80 backward prepares them (dq_accum zeroed; for
// GQA dk_accum / dv_accum zeroed, else nullptr and dK / dV written directly).
template <class Cfg, typename Element>
void launch_bwd_main_sm90(const sm80::BwdArgs& args, cudaStream_t stream,
                          BwdOrder order = BwdOrder::kAuto) {
  const BwdParams& p = args.p;
  if (const char* why = bwd_unsupported(p, Cfg::kD))
    throw std::runtime_error(std::string("flashattn sm90 bwd: unsupported call: ") + why);
  const int64_t rows_q = p.is_varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = p.is_varlen ? p.total_k : p.seqlen_k;
  if (p.seqlen_q <= 0 || p.seqlen_k <= 0 || rows_q <= 0 || rows_k <= 0) return;
  const BwdMaps maps = bwd_tensor_maps<Element>(args, Cfg::kD, Cfg::kBM, Cfg::kBN);
  const dim3 grid(static_cast<unsigned>((p.seqlen_k + Cfg::kBN - 1) / Cfg::kBN), p.nheads,
                  p.batch);
#ifndef FLASHATTN_DISABLE_DROPOUT
  auto kernel = p.dropout_threshold > 0 ? bwd_kernel_sm90<Cfg, Element, true>
                                        : bwd_kernel_sm90<Cfg, Element, false>;
#else
  auto kernel = bwd_kernel_sm90<Cfg, Element, false>;
#endif
  if (bwd_score_mod_call(p)) kernel = bwd_kernel_sm90<Cfg, Element, false, false, true>;
  if (p.deterministic) kernel = bwd_kernel_sm90<Cfg, Element, false, false, false, true>;
  // Block-sparse (bwd_sparse_unsupported took it): the list past the tiles.
  const int64_t list_cap = bwd_sparse_list_cap(p, Cfg::kBM);
  if (p.q_num_blocks != nullptr) {
#ifndef FLASHATTN_DISABLE_BLOCK_SPARSE
    kernel = bwd_kernel_sm90<Cfg, Element, false, true>;
#else
    throw std::runtime_error("flashattn sm90 bwd: built with FLASHATTN_DISABLE_BLOCK_SPARSE");
#endif
    if (p.block_m % Cfg::kBM != 0 || p.block_n % Cfg::kBN != 0)
      throw std::runtime_error("flashattn sm90 bwd: block sizes not multiples of the tile");
  }
#ifndef FLASHATTN_DISABLE_DROPOUT
  // bwd_unsupported sends dropout with a score transform, deterministic or a block mask to
  // sm80; were that lifted, the dropout would be lost here, so say so instead.
  if (p.dropout_threshold > 0 && kernel != bwd_kernel_sm90<Cfg, Element, true>)
    throw std::runtime_error("flashattn sm90 bwd: a dropout call without the dropout kernel");
#endif
  const int64_t smem = Cfg::kSmem + bwd_sparse_smem_bytes(p, list_cap);
  if (smem > smem_optin_bytes())
    throw std::runtime_error("flashattn sm90 bwd: a block mask of " + std::to_string(list_cap) +
                             " query tiles needs " + std::to_string(smem) +
                             " bytes of shared memory, above the GPU's");
  if (int64_t(grid.x) * grid.y * grid.z > INT32_MAX)
    throw std::runtime_error("flashattn sm90 bwd: 2^31 CTAs or more");
  const int sect = bwd_section_pairs(p, Cfg::kD, order);
  sm80::BwdArgs a = args;
  a.det_diag = sm90_det_diag_call(p);
  a.det_dq_warps = sm90_det_dq_warps(p);
  // Block-sparse: heavy key blocks first (bwd_order_sm90.cuh), ordered on the device into the
  // workspace's entries past the sm80 layout's (bwd_workspace); a workspace without them (the
  // self-test's) keeps the section order.
  const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
  const int64_t order_at = sm80::bwd_workspace_layout(p, Cfg::kD).i32_elems;
  if (order == BwdOrder::kAuto && sm90_sparse_order_enabled() && bwd_order_entries(p) == ctas &&
      p.workspace_i32 != nullptr && p.workspace_i32_elems >= order_at + ctas) {
    int* buf = p.workspace_i32 + order_at;
    bwd_sparse_order_kernel<><<<1, kBwdOrderThreads, 0, stream>>>(
        p, Cfg::kBN, sect, static_cast<int>(grid.x), static_cast<int>(grid.y),
        static_cast<int>(grid.y * grid.z), buf);
    a.order = buf;
    FLASHATTN_LAUNCH_CHECK();
  }
  auto launch = [&](decltype(kernel) k) {
    FLASHATTN_CUDA_CHECK(set_max_dynamic_smem(k, static_cast<int>(smem)));
    k<<<grid, Cfg::kThreads, static_cast<size_t>(smem), stream>>>(a, maps, sect,
                                                                 static_cast<int>(list_cap));
    FLASHATTN_LAUNCH_CHECK();
  };
  launch(kernel);
#ifndef FLASHATTN_DISABLE_DROPOUT
  if (dropout_offsets_call(p))  // the cell-by-cell mask's kernel beside it (dropout_lanes.cuh)
    launch(bwd_kernel_sm90<Cfg, Element, true, false, false, false, true>);
#endif
}

}  // namespace flashattn::sm90

// The d 256 kernel's launch (launch_bwd_d256_sm90.cuh), on the helpers above.
#include "launch_bwd_d256_sm90.cuh"

namespace flashattn::sm90 {

// The head dims with a package backward kernel (the accumulators' sm80 bucket; qk = v): 64 and
// 128 on bwd_kernel_sm90, 256 on bwd_kernel_d256_sm90.
// The list is also read by tools/generate_instantiations.py (keep the format).
inline constexpr int kBwdHeadDims[] = {64, 128, 256};

template <class Cfg, typename Element>
void bwd_main_launch(const sm80::BwdArgs& args, cudaStream_t stream) {
  launch_bwd_main_sm90<Cfg, Element>(args, stream);
}
template <typename Element>
void bwd_main_launch_d256(const sm80::BwdArgs& args, cudaStream_t stream) {
  launch_bwd_main_d256_sm90<Element>(args, stream);
}

// The package's backward: the sm80 preprocessing, this main kernel, the sm80 conversions, on
// the sm80 workspace layout of the bucket (bwd_workspace).
template <int kD, int kDv, typename Element>
void run_bwd_hdim(const BwdParams& p, cudaStream_t stream) {
  static_assert(kD == kDv, "qk and v head dims share the bucket");
  using Tile = typename sm80::BwdTileFor<kD>::type;
  constexpr auto main_launch = [] {  // the d 256 kernel at its bucket, bwd_kernel_sm90 below
    if constexpr (kD == BwdConfigD256::kD) return &bwd_main_launch_d256<Element>;
    else return &bwd_main_launch<BwdConfigFor<kD>, Element>;
  }();
  sm80::run_bwd_tile<Tile, Element, false>(p, stream, sm80::bwd_workspace_layout(p, kD), false,
                                           main_launch);
}

}  // namespace flashattn::sm90
