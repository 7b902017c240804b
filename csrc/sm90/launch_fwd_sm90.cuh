// Host side of the Hopper forward (kernel_fwd_sm90.cuh): what it takes, TMA tensor maps through
// the driver entry point (no libcuda to link against), the launch. Instantiated per (head-dim
// variant, dtype) in csrc/instantiations/fwd_sm90_hdim*_*.cu.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../common/cuda_check.h"
#include "kernel_fwd_sm90.cuh"
#include "stage_fp8_sm90.cuh"

namespace flashattn::sm90 {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    FLASHATTN_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                          cudaEnableDefault, &q));
    if (f == nullptr || q != cudaDriverEntryPointSuccess)
      throw std::runtime_error("flashattn sm90: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A (batch, rows, heads, cols) tensor of `type` (elem_bytes each; strides in elements) as boxes
// of box_cols columns x box_rows rows of one head, swizzled by the box's row bytes (128 or 64);
// varlen (batch == 0): a 3-D (rows, heads, cols) map. Reads past the extents (rows, columns
// past the head dim) give zeros.
inline CUtensorMap tensor_map_of(CUtensorMapDataType type, int elem_bytes, const void* ptr,
                                 int cols, int64_t rows, int heads, int batch, int64_t row_stride,
                                 int64_t head_stride, int64_t batch_stride, int box_cols,
                                 int box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads),
                              cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(row_stride) * elem_bytes,
                                 cuuint64_t(head_stride) * elem_bytes,
                                 cuuint64_t(batch_stride) * elem_bytes};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1},
                   estr[4] = {1, 1, 1, 1};
  const int row_bytes = box_cols * elem_bytes;
  const CUresult r = tensor_map_encoder()(
      &m, type, batch == 0 ? 3 : 4, const_cast<void*>(ptr), dims, strides, box, estr,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("flashattn sm90: cuTensorMapEncodeTiled failed (" +
                             std::to_string(int(r)) + ")");
  return m;
}

// A 16-bit tensor as boxes of 64 columns x box_rows rows, 128-byte swizzled.
template <typename Element>
CUtensorMap tensor_map(const void* ptr, int cols, int64_t rows, int heads, int batch,
                       int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                       int box_rows) {
  constexpr CUtensorMapDataType kType = std::is_same_v<Element, __half>
                                            ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return tensor_map_of(kType, 2, ptr, cols, rows, heads, batch, row_stride, head_stride,
                       batch_stride, 64, box_rows);
}

inline bool aligned_to(const void* x, int bytes) {
  return reinterpret_cast<uintptr_t>(x) % bytes == 0;
}
// Three element strides of a 16-bit tensor, multiples of m, in [0, 2^39) (TMA with m = 8: byte
// strides multiples of 16, below 2^40).
inline bool strides_ok(int64_t a, int64_t b, int64_t c, int64_t m) {
  auto one = [m](int64_t x) { return x >= 0 && x < (int64_t(1) << 39) && x % m == 0; };
  return one(a) && one(b) && one(c);
}

// Why the sm90 forward does not take this call (nullptr: it does). The API layer then runs
// sm80, or raises this reason under FLASHATTN_FORCE_BACKEND=sm90. Windows come as the API
// passes them (a side >= seqlen_k as -1). Device checks (compute capability 9.0, shared
// memory, head dims built) are the caller's: dispatch_fwd_sm90.cu.
// The FLASHATTN_SM90_* switches below (read per call, so tests can flip them): whether the
// variable `name` is exactly the one character v.
inline bool env_is(const char* name, char v) {
  const char* env = std::getenv(name);
  return env != nullptr && env[0] == v && env[1] == '\0';
}

// The sm90 dropout forward: on (its forced-sm90 tests passed on the H200, 2026-12-02, fourth
// session); FLASHATTN_SM90_DROPOUT=0 sends dropout calls to the sm80 kernels (read per call).
inline bool sm90_dropout_enabled() { return !env_is("FLASHATTN_SM90_DROPOUT", '0'); }

// The epilogue's TMA store of O (kernel_fwd_sm90.cuh, kTmaO; written 2026-12-04): on;
// FLASHATTN_SM90_TMA_O=0 stores O from registers instead (read per call, for the A/B).
inline bool sm90_tma_o_enabled() { return !env_is("FLASHATTN_SM90_TMA_O", '0'); }

// The FP8 forward's V^T made on chip (kernel_fwd_sm90.cuh's kVChip; written 2026-12-04, third
// session, without a GPU): off, the staging pass makes it; FLASHATTN_SM90_FP8_VCHIP=1 turns the
// on-chip transpose on (read per call, for the tests and the A/B).
inline bool sm90_fp8_vchip_enabled() { return env_is("FLASHATTN_SM90_FP8_VCHIP", '1'); }

// The FP8 d64 short local tile (tile_fwd_sm90.h's fwd_tile_fp8_short_local): off (written
// 2026-12-07 without a GPU); FLASHATTN_SM90_FP8_SHORT=1 turns it on (read per call, for the
// tests and the A/B).
inline bool sm90_fp8_short_enabled() { return env_is("FLASHATTN_SM90_FP8_SHORT", '1'); }

// The FP8 long-key tile (tile_fwd_sm90.h's fwd_tile_fp8_long) for a call over `keys` keys: on
// from min_keys (fwd_fp8_long_min_keys) up (timed on an H100: d 128 +4-5% non-causal 8k / 16k,
// 2026-12-06; d 256 +4-12% from 2k, 2026-12-07; its reference tests,
// test_fp8_forward_long_tile, run at every length under =1); FLASHATTN_SM90_FP8_LONG=0 turns it
// off, =1 takes it at every length. Read per call.
inline bool sm90_fp8_long_keys(int64_t keys, int min_keys) {
  if (env_is("FLASHATTN_SM90_FP8_LONG", '0')) return false;
  return env_is("FLASHATTN_SM90_FP8_LONG", '1') || keys >= min_keys;
}

// The short local tile (tile_fwd_sm90.h's fwd_tile_short_local): on since its tests passed on
// the H200 and it timed +10% / +13% at d 64 causal 512 / 1k (2026-12-04, e001a1e);
// FLASHATTN_SM90_SHORT_LOCAL=0 turns it off (read per call, for the A/B).
inline bool sm90_short_local_enabled() { return !env_is("FLASHATTN_SM90_SHORT_LOCAL", '0'); }
// The calls a short local tile (bf16 fwd_tile_short_local, FP8 fwd_tile_fp8_short_local) takes
// by shape: causal or windowed, at most kShortLocalRows query rows (each caller adds its own
// conditions: no dropout or score transform, its switch).
inline bool fwd_short_local_shape(const FwdParams& p) {
  return (p.window_left >= 0 || p.window_right >= 0) && p.seqlen_q <= kShortLocalRows;
}

// The head-dim variant of a call: its head dims' (FP8: rounded up to multiples of 8, the
// staging pass and the epilogue take any) first variant, -1 when none holds them.
inline int fwd_variant_of_call(const FwdParams& p) {
  if (p.dtype == DType::kFloat8E4M3)
    return fwd_variant((p.headdim + 7) / 8 * 8, (p.headdim_v + 7) / 8 * 8);
  return fwd_variant(p.headdim, p.headdim_v);
}

// The tile of a block-sparse call (run_fwd_hdim; block_m 0: none).
inline FwdTile fwd_sparse_tile_of_call(const FwdParams& p) {
  const int v = fwd_variant_of_call(p);
  return fwd_tile_sparse(kFwdHeadDimsQK[v], kFwdHeadDimsV[v],
                         p.window_left >= 0 || p.window_right >= 0);
}

// A block mask (params.h) runs on sm90 when the variant has a block-sparse tile
// (fwd_tile_sparse: 128 x 128 up to d128 and at 192 x 128; none at d256 or 192 x 192), the
// mask's blocks are whole such tiles and the batch is padded; the sm80 kernels run the
// others, with their unit path.
inline const char* fwd_sparse_unsupported(const FwdParams& p) {
  if (p.kv_num_blocks == nullptr) return nullptr;
#if defined(FLASHATTN_DISABLE_BLOCK_SPARSE) || defined(FLASHATTN_DISABLE_DROPOUT)
  return "a block mask (this build has no sm90 block-sparse kernels)";
#endif
  if (p.is_varlen) return "a block mask on varlen batches (not yet: the sm80 kernels run it)";
  if (fwd_variant_of_call(p) < 0) return nullptr;  // named below
  const FwdTile t = fwd_sparse_tile_of_call(p);
  if (t.block_m == 0)
    return "a block mask at these head dims (no sm90 block-sparse tile yet: d 192 with v "
           "192, d 256; the sm80 kernels run it)";
  if (p.block_m <= 0 || p.block_n <= 0 || p.block_m % t.block_m != 0 ||
      p.block_n % t.block_n != 0)
    return "a block mask whose block sizes are not multiples of the sm90 tile of its head dims "
           "(the sm80 kernels run it)";
  return nullptr;
}

// Block-sparse: a tile list holds every kernel key tile of the mask (0: no block mask).
inline int64_t fwd_sparse_list_cap(const FwdParams& p, int block_n) {
  return p.kv_num_blocks == nullptr ? 0 : int64_t(p.n_kblocks) * (p.block_n / block_n);
}

// FP8 (issue 14): any strides and head dims up to 256 (the staging pass packs what TMA cannot
// read: stage_fp8_sm90.cuh), out bf16 or fp16 at any strides (2-byte stores where 4-byte ones
// do not fit).
inline const char* fwd_unsupported(const FwdParams& p) {
  const bool fp8 = p.dtype == DType::kFloat8E4M3;
  if (fp8) {
#ifdef FLASHATTN_DISABLE_FP8
    return "FP8 (this build has no FP8 kernels: FLASHATTN_DISABLE_FP8)";
#endif
    if (p.out_dtype != DType::kBFloat16 && p.out_dtype != DType::kFloat16)
      return "an FP8 call's out dtype (it takes bfloat16 and float16)";
    if (p.dropout_threshold > 0 || p.kv_num_blocks != nullptr || p.sink_ptr != nullptr ||
        p.alibi_slopes != nullptr)
      return "FP8 with dropout, a block mask, a sink or ALiBi (the API refuses them)";
  } else if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) {
    return "dtype (it takes float16, bfloat16 and float8_e4m3fn)";
  }
  if (const char* why = fwd_sparse_unsupported(p)) return why;
  if (p.dropout_threshold > 0 && !sm90_dropout_enabled())
    return "dropout (FLASHATTN_SM90_DROPOUT=0 turns the sm90 dropout forward off; the sm80 "
           "kernels run dropout)";
  if (fwd_variant_of_call(p) < 0)
    return fp8 ? "head dim (FP8: qk and v head dims up to 256)"
               : "head dim (it takes qk and v head dims that are multiples of 8, up to 256)";
  if (p.nheads_k < 1 || p.nheads % p.nheads_k != 0) return "nheads not a multiple of nheads_k";
  if (p.nheads > 65535 || p.batch > 65535) return "more than 65535 heads or batch entries";
  if (p.is_varlen && (p.cu_seqlens_q == nullptr || p.cu_seqlens_k == nullptr))
    return "varlen without cu_seqlens_q and cu_seqlens_k";
  if (p.total_q >= (int64_t(1) << 31) || p.total_k >= (int64_t(1) << 31))
    return "2^31 rows or more (TMA coordinates are int32)";
  if ((int64_t(p.seqlen_q) + 63) / 64 * p.nheads * p.batch > INT32_MAX)
    return "2^31 query tiles or more";
  if (fp8) return nullptr;  // strides and alignment: staged (q, k, v) or per store (out)
  if (!aligned_to(p.q_ptr, 16) || !aligned_to(p.k_ptr, 16) || !aligned_to(p.v_ptr, 16))
    return "q, k or v not 16-byte aligned (TMA)";
  if (!strides_ok(p.q_row_stride, p.q_head_stride, p.q_batch_stride, 8) ||
      !strides_ok(p.k_row_stride, p.k_head_stride, p.k_batch_stride, 8) ||
      !strides_ok(p.v_row_stride, p.v_head_stride, p.v_batch_stride, 8))
    return "q, k or v strides not multiples of 8 elements below 2^39 (TMA)";
  if (!strides_ok(p.o_row_stride, p.o_head_stride, p.o_batch_stride, 2) ||
      !aligned_to(p.o_ptr, 4))
    return "out not 4-byte aligned";
  return nullptr;
}

// Launch geometry: max_ctas bounds the grid (a persistent one when below the tile count),
// group is the (head, sequence) pairs per group of the tile order (kernel_fwd_sm90.cuh), deal
// how a persistent grid deals the tiles (tile_order_sm90.h); 0 / 0 / -1 = the package's choice
// (below). The self-test times the alternatives.
struct FwdGrid {
  int64_t max_ctas = 0;
  int group = 0;
  int deal = -1;
};

// One launch of the kernel of a given shape (the self-test times several).
// The FP8 kernels' V^T (stage_fp8_sm90.cuh): its bytes and row pitch.
struct Fp8VT {
  const uint8_t* ptr = nullptr;
  int64_t pitch = 0;
};

// The tensor maps of a call: 16-bit q / k / v boxes of 64 columns; FP8 q / k boxes of
// kQKChunkCols bytes and V^T's of 128 keys x kDv columns (the staged pointers).
template <class Cfg, typename Element>
FwdMaps fwd_maps(const FwdParams& p, const Fp8VT& vt) {
  const int64_t rows_q = p.is_varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = p.is_varlen ? p.total_k : p.seqlen_k;
  const int batch = p.is_varlen ? 0 : p.batch;  // 0: a 3-D map
  if constexpr (Cfg::kFp8) {
    constexpr CUtensorMapDataType kU8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    const CUtensorMap q_map =
        tensor_map_of(kU8, 1, p.q_ptr, p.headdim, rows_q, p.nheads, batch, p.q_row_stride,
                      p.q_head_stride, p.q_batch_stride, Cfg::kQKChunkCols, Cfg::kBM);
    if (rows_k <= 0) return FwdMaps{q_map, q_map, q_map, q_map};
    const CUtensorMap k_map =
        tensor_map_of(kU8, 1, p.k_ptr, p.headdim, rows_k, p.nheads_k, batch, p.k_row_stride,
                      p.k_head_stride, p.k_batch_stride, Cfg::kQKChunkCols, Cfg::kBN);
    if constexpr (Cfg::kVChip) {  // V as it lies, for the on-chip transpose
      (void)vt;
      return FwdMaps{q_map, k_map,
                     tensor_map_of(kU8, 1, p.v_ptr, p.headdim_v, rows_k, p.nheads_k, batch,
                                   p.v_row_stride, p.v_head_stride, p.v_batch_stride,
                                   Cfg::kVRawChunkB, Cfg::kBN),
                     q_map};
    } else {
      const int64_t vt_head = int64_t(p.headdim_v) * vt.pitch;
      return FwdMaps{q_map, k_map,
                     tensor_map_of(kU8, 1, vt.ptr, static_cast<int>(vt.pitch), p.headdim_v,
                                   p.nheads_k, batch, vt.pitch, vt_head, vt_head * p.nheads_k,
                                   Cfg::kVChunkB, Cfg::kDv),
                     q_map};
    }
  } else {
    (void)vt;
    const CUtensorMap q_map =
        tensor_map<Element>(p.q_ptr, p.headdim, rows_q, p.nheads, batch, p.q_row_stride,
                            p.q_head_stride, p.q_batch_stride, Cfg::kBM);
    // No keys: every row gets O = 0 and lse = -inf and nothing is loaded, but a tensor map
    // needs extents >= 1 and an address: q's stands in for the empty k and v.
    if (rows_k <= 0) return FwdMaps{q_map, q_map, q_map, q_map};
    return FwdMaps{q_map,
                   tensor_map<Element>(p.k_ptr, p.headdim, rows_k, p.nheads_k, batch,
                                       p.k_row_stride, p.k_head_stride, p.k_batch_stride,
                                       Cfg::kBN),
                   tensor_map<Element>(p.v_ptr, p.headdim_v, rows_k, p.nheads_k, batch,
                                       p.v_row_stride, p.v_head_stride, p.v_batch_stride,
                                       Cfg::kBN),
                   q_map};
  }
}

template <class Cfg, typename Element, bool Has_score_mod, bool Has_dropout = false,
          bool Is_sparse = false>
void launch_fwd_sm90_kernel(const FwdParams& p, cudaStream_t stream, FwdGrid g,
                            const Fp8VT& vt = {}) {
  if (const char* why = fwd_unsupported(p))
    throw std::runtime_error(std::string("flashattn sm90 fwd: unsupported call: ") + why);
  if (p.headdim > Cfg::kD || p.headdim_v > Cfg::kDv)
    throw std::runtime_error("flashattn sm90 fwd: head dims above the kernel's");
  const int64_t rows_q = p.is_varlen ? p.total_q : p.seqlen_q;
  if (p.seqlen_q <= 0 || rows_q <= 0 || p.batch <= 0 || p.nheads <= 0) return;
  if (Cfg::kFp8 != (p.dtype == DType::kFloat8E4M3) ||
      (Cfg::kFp8 && !Cfg::kVChip && vt.ptr == nullptr))
    throw std::runtime_error("flashattn sm90 fwd: an FP8 call needs the FP8 kernel and its V^T");
  FwdMaps maps = fwd_maps<Cfg, Element>(p, vt);
  // The epilogue's TMA store (kTmaO): padded calls (varlen boxes would cross into the next
  // sequence) with a TMA-addressable out.
  const bool tma_o = Cfg::kTmaO && !p.is_varlen && sm90_tma_o_enabled() &&
                     aligned_to(p.o_ptr, 16) &&
                     strides_ok(p.o_row_stride, p.o_head_stride, p.o_batch_stride, 8);
  if (tma_o)
    maps.o = tensor_map<Element>(p.o_ptr, p.headdim_v, p.seqlen_q, p.nheads, p.batch,
                                 p.o_row_stride, p.o_head_stride, p.o_batch_stride, 64);
  const int64_t tiles = (p.seqlen_q + Cfg::kBM - 1) / Cfg::kBM * p.nheads * p.batch;
  if (tiles > INT32_MAX) throw std::runtime_error("flashattn sm90 fwd: 2^31 tiles or more");
  // Persistent, one CTA per SM (the next tile's Q and K load under a tile's epilogue: +5-20%
  // over one CTA per tile for causal at N <= 4k, self-test, interleaved and cold). Causal /
  // window tiles differ in length, so they go out in pairs of near-constant cost: the snake
  // (for equal tiles) left 1.2-1.8x the ideal makespan on the slowest CTA at 8k-16k, as a
  // schedule model predicted (benchmarks/NOTES.md, 2026-12-02).
  const bool local = p.window_left >= 0 || p.window_right >= 0;
  const int64_t max_ctas =
      g.max_ctas > 0 ? g.max_ctas : current_device_attribute(cudaDevAttrMultiProcessorCount);
  // Block-sparse: the two tile lists past the tile's shared memory.
  if ((p.kv_num_blocks != nullptr) != Is_sparse)
    throw std::runtime_error("flashattn sm90 fwd: a block mask needs the sparse kernel");
  if (Is_sparse && (p.block_m % Cfg::kBM != 0 || p.block_n % Cfg::kBN != 0))
    throw std::runtime_error("flashattn sm90 fwd: block sizes not multiples of the tile");
  const int64_t list_cap = fwd_sparse_list_cap(p, Cfg::kBN);
  const int64_t smem = Cfg::kSmem + (Is_sparse ? fwd_sparse_smem_bytes(list_cap) : 0);
  if (smem > smem_optin_bytes())
    throw std::runtime_error("flashattn sm90 fwd: a block mask of " + std::to_string(list_cap) +
                             " key tiles needs " + std::to_string(smem) +
                             " bytes of shared memory, above the GPU's");
  const unsigned grid = static_cast<unsigned>(tiles < max_ctas ? tiles : max_ctas);
  const int deal = g.deal >= 0 ? g.deal : local && grid < tiles ? kDealPairs : kDealSnake;
  // One (head, sequence) pair per group of the tile order: a head's query blocks run together
  // and its K / V stay in L2 (with groups of 3 at d128 16k nc, 24 MB of K / V, the package
  // benchmark gave 543 TFLOP/s, the one-head order 606 before: benchmarks/NOTES.md). The
  // pair deal reads the list as groups of one.
  const int64_t pairs = int64_t(p.nheads) * p.batch;
  const int group = deal == kDealPairs
                        ? 1
                        : static_cast<int>(std::min<int64_t>(g.group > 0 ? g.group : 1, pairs));
  // FP8's out (any strides, any head dim): 2-byte stores where the 4-byte ones of whole n8
  // blocks would be misaligned or cross the head dim.
  const bool o_halves = Cfg::kFp8 && !(p.headdim_v % 8 == 0 && aligned_to(p.o_ptr, 4) &&
                                       strides_ok(p.o_row_stride, p.o_head_stride,
                                                  p.o_batch_stride, 2));
  auto launch = [&](auto kernel) {
    FLASHATTN_CUDA_CHECK(set_max_dynamic_smem(kernel, static_cast<int>(smem)));
    kernel<<<grid, Cfg::kThreads, static_cast<size_t>(smem), stream>>>(
        p, maps, group, deal, static_cast<int>(list_cap), tma_o ? 1 : 0, o_halves ? 1 : 0);
    FLASHATTN_LAUNCH_CHECK();
  };
  launch(fwd_kernel_sm90<Cfg, Element, Has_score_mod, Has_dropout, Is_sparse>);
  if constexpr (Has_dropout)  // the cell-by-cell mask's kernel beside it (dropout_lanes.cuh)
    if (dropout_offsets_call(p))
      launch(fwd_kernel_sm90<Cfg, Element, Has_score_mod, Has_dropout, Is_sparse, true>);
}

// Whether a call needs the score-transform kernel: softcap or ALiBi on, or a scale <= 0
// (max-then-scale needs it > 0).
inline bool fwd_score_mod(const FwdParams& p) {
  return p.softcap > 0.f || p.alibi_slopes != nullptr || !(p.softmax_scale > 0.f);
}

// A block mask's kernels (fwd_tile_sparse's shape): a plain one, and one with dropout and the
// score transform switched inside (that run-time switch of dropout spills, so the plain
// calls keep their own).
template <class Cfg, typename Element>
void launch_fwd_sm90_sparse(const FwdParams& p, cudaStream_t stream, FwdGrid g = {}) {
#if !defined(FLASHATTN_DISABLE_BLOCK_SPARSE) && !defined(FLASHATTN_DISABLE_DROPOUT)
  if (p.dropout_threshold > 0 || fwd_score_mod(p))
    launch_fwd_sm90_kernel<Cfg, Element, false, true, true>(p, stream, g);
  else
    launch_fwd_sm90_kernel<Cfg, Element, false, false, true>(p, stream, g);
#else
  (void)p, (void)stream, (void)g;
  throw std::runtime_error("flashattn sm90 fwd: built without the block-sparse kernels");
#endif
}

// The kernel of a shape for this call: with the score transform where fwd_score_mod says so.
template <class Cfg, typename Element>
void launch_fwd_sm90(const FwdParams& p, cudaStream_t stream, FwdGrid g = {}) {
  if (p.dropout_threshold > 0) {  // the score transform switched inside
#ifndef FLASHATTN_DISABLE_DROPOUT
    launch_fwd_sm90_kernel<Cfg, Element, false, true>(p, stream, g);
#else
    throw std::runtime_error("flashattn sm90 fwd: built with FLASHATTN_DISABLE_DROPOUT");
#endif
  } else if (fwd_score_mod(p))
    launch_fwd_sm90_kernel<Cfg, Element, true>(p, stream, g);
  else
    launch_fwd_sm90_kernel<Cfg, Element, false>(p, stream, g);
}

// The package's kernels of the (kD, kDv) variant: tile_fwd_sm90.h's tile, the local one
// (causal or window) when it differs, the long-key one (fwd_tile_long) for plain non-causal
// and causal calls over >= kLongKeys keys, the short local one (fwd_tile_short_local) for
// plain causal / window calls of at most kShortLocalRows query rows (when switched on).
template <int kD, int kDv, typename Element>
void run_fwd_hdim(const FwdParams& p, cudaStream_t stream) {
  constexpr FwdTile kGlobal = fwd_tile(kD, kDv, false), kLocal = fwd_tile(kD, kDv, true);
  constexpr FwdTile kLong = fwd_tile_long(kD, kDv);
  constexpr FwdTile kShort = fwd_tile_short_local(kD, kDv);
  constexpr FwdTile kSparse = fwd_tile_sparse(kD, kDv, false);
  static_assert(kSparse == fwd_tile_sparse(kD, kDv, true), "one block-sparse tile per variant");
  if (p.kv_num_blocks != nullptr) {  // fwd_sparse_unsupported took the call
    if constexpr (kSparse.block_m > 0) {
      using Sparse = FwdConfig<kD, kDv, kSparse.block_m, kSparse.block_n, kSparse.stages,
                               kSparse.schedule, 0, 0, fwd_v_late(kD, kDv)>;
      launch_fwd_sm90_sparse<Sparse, Element>(p, stream);
      return;
    }
    throw std::runtime_error("flashattn sm90 fwd: no block-sparse tile at these head dims");
  }
  if constexpr (kLong.block_m > 0) {
    const bool plain = p.dropout_threshold <= 0 && !fwd_score_mod(p);
    const bool causal_or_none = p.window_left < 0 && p.window_right <= 0;
    if (plain && causal_or_none && p.seqlen_k >= kLongKeys &&
        smem_optin_bytes() >= fwd_smem_bytes(kLong, kD, kDv)) {
      using Long = FwdConfig<kD, kDv, kLong.block_m, kLong.block_n, kLong.stages, kLong.schedule,
                             0, 0, fwd_v_late(kD, kDv)>;
      launch_fwd_sm90_kernel<Long, Element, false>(p, stream, {});
      return;
    }
  }
  if constexpr (kShort.block_m > 0) {
    const bool plain = p.dropout_threshold <= 0 && !fwd_score_mod(p);
    if (plain && fwd_short_local_shape(p) && sm90_short_local_enabled()) {
      using Short = FwdConfig<kD, kDv, kShort.block_m, kShort.block_n, kShort.stages,
                              kShort.schedule, 0, 0, fwd_v_late(kD, kDv)>;
      launch_fwd_sm90_kernel<Short, Element, false>(p, stream, {});
      return;
    }
  }
  if constexpr (kGlobal == kLocal) {
    launch_fwd_sm90<FwdConfigOf<kD, kDv, false>, Element>(p, stream);
  } else {
    if (p.window_left >= 0 || p.window_right >= 0)
      launch_fwd_sm90<FwdConfigOf<kD, kDv, true>, Element>(p, stream);
    else
      launch_fwd_sm90<FwdConfigOf<kD, kDv, false>, Element>(p, stream);
  }
}

// The FP8 forward of the (kD, kDv) variant, out in Out (bf16 / fp16): the staging pass
// (stage_fp8_sm90.cuh) into the workspace (fwd_workspace), then the FP8 kernel (the score
// transform's variant for softcap), one tile shape for every mask but the long-key one
// (fwd_tile_fp8_long: plain non-causal / causal calls over >= fwd_fp8_long_min_keys keys) and,
// when switched on, the short local one (fwd_tile_fp8_short_local: plain causal / window calls
// of at most kShortLocalRows query rows).
template <int kD, int kDv, typename Out>
void run_fwd_fp8_hdim(const FwdParams& p, cudaStream_t stream) {
#ifdef FLASHATTN_DISABLE_FP8
  (void)p, (void)stream;
  throw std::runtime_error("flashattn sm90 fwd: built with FLASHATTN_DISABLE_FP8");
#else
  const bool vchip = sm90_fp8_vchip_enabled();
  const Fp8Stage st = fp8_stage_of(p, vchip);
  if (st.total > 0 && (p.workspace_f32 == nullptr || p.workspace_f32_elems * 4 < st.total))
    throw std::runtime_error("flashattn sm90 fwd: the FP8 call's workspace is missing or short");
  uint8_t* ws = reinterpret_cast<uint8_t*>(p.workspace_f32);
  run_fp8_stage(p, st, ws, stream);
  const FwdParams q = fp8_staged_params(p, st, ws);
  const Fp8VT vt{ws, st.vt_pitch};
  auto launch = [&](auto cfg) {
    using Cfg = decltype(cfg);
    if (fwd_score_mod(q)) launch_fwd_sm90_kernel<Cfg, Out, true>(q, stream, {}, vt);
    else launch_fwd_sm90_kernel<Cfg, Out, false>(q, stream, {}, vt);
  };
  constexpr FwdTile kLong = fwd_tile_fp8_long(kD, kDv);
  if constexpr (kLong.block_m > 0) {
    const bool causal_or_none = q.window_left < 0 && q.window_right <= 0;
    if (!vchip && !fwd_score_mod(q) && causal_or_none &&
        sm90_fp8_long_keys(q.seqlen_k, fwd_fp8_long_min_keys(kD)) &&
        smem_optin_bytes() >= fwd_smem_bytes(kLong, kD, kDv, 1)) {
      launch_fwd_sm90_kernel<FwdConfigFp8<kD, kDv, 0, kFp8Long>, Out, false>(q, stream, {}, vt);
      return;
    }
  }
  constexpr FwdTile kShort = fwd_tile_fp8_short_local(kD, kDv);
  if constexpr (kShort.block_m > 0) {
    if (!vchip && !fwd_score_mod(q) && fwd_short_local_shape(q) && sm90_fp8_short_enabled()) {
      launch_fwd_sm90_kernel<FwdConfigFp8<kD, kDv, 0, kFp8Short>, Out, false>(q, stream, {}, vt);
      return;
    }
  }
  if (vchip) launch(FwdConfigFp8<kD, kDv, 1>{});
  else launch(FwdConfigFp8<kD, kDv, 0>{});
#endif
}

// The workspace of a forward call: FP8's staged inputs (f32 elements), none otherwise.
inline WorkspaceSizes fwd_workspace_of(const FwdParams& p) {
  WorkspaceSizes w;
  if (p.dtype == DType::kFloat8E4M3)
    w.f32_elems = (fp8_stage_of(p, sm90_fp8_vchip_enabled()).total + 3) / 4;
  return w;
}

// The largest shared memory any kernel of the variant takes (the device check).
inline int fwd_smem_of_variant(int variant) {
  const int d = kFwdHeadDimsQK[variant], dv = kFwdHeadDimsV[variant];
  const int a = fwd_smem_bytes(fwd_tile(d, dv, false), d, dv);
  const int b = fwd_smem_bytes(fwd_tile(d, dv, true), d, dv);
  return a > b ? a : b;  // the long-key tile (more) only where smem_optin_bytes() allows it
}

}  // namespace flashattn::sm90
