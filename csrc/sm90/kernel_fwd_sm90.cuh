// The Hopper forward (sm_90a), bf16 / fp16, head dims (kD, kDv) multiples of 64 (calls with
// smaller head dims load zeros past them): padded or varlen batches, any window (causal
// included), GQA. A persistent grid over tiles of kBM query rows of a (head, sequence).
// Warpgroup 0 loads with TMA: each tile's Q, K and V through rings of full and empty mbarriers. The kBM / 64 consumer
// warpgroups take 64 query rows each: S = Q K^T and O += P V by WGMMA, the online softmax in
// registers between them. Host side: launch_fwd_sm90.cuh; torch-free checks:
// tools/selftest/selftest_fwd_sm90.cu.
#pragma once
#include <cuda.h>  // CUtensorMap (types only)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/block_sparse_tiles.cuh"
#include "../common/dropout_lanes.cuh"
#include "../common/mask.h"
#include "../common/params.h"
#include "../common/row_finish.h"
#include "../common/score_mod.h"
#include "../common/seqlen.h"
#include "primitives_bwd_sm90.cuh"
#include "primitives_sm90.cuh"
#include "fp8_layout_sm90.h"
#include "fwd_config_sm90.cuh"
#include "tile_fwd_sm90.h"
#include "tile_order_sm90.h"
#include "transpose_v_fp8_sm90.cuh"

namespace flashattn::sm90 {

struct FwdMaps {
  CUtensorMap q, k, v;  // 4-D (d, row, head, batch) padded; 3-D (d, row, head) varlen
  CUtensorMap o;        // padded calls of a kTmaO kernel: 4-D, boxes of 64 columns x 64 rows
};

// Persistent: CTA i takes tiles fwd_tile_of(0, i), fwd_tile_of(1, i), ... dealt by `deal`
// (tile_order_sm90.h; grid = SM count; or one tile per CTA). Has_score_mod: softcap and / or ALiBi
// (or a scale <= 0): S is turned into natural-log units (common/score_mod.h) before the softmax,
// else the raw q.k feeds exp2 with the folded scale. The producer runs ahead into the next tile
// (its Q once the consumers' last S is done, its K / V as stages free up), so loads overlap the
// epilogue. The K / V ring counts iterations across tiles. Key blocks are visited from the last
// (the masked one, for causal) down. Has_dropout (params.h): Z on P before P V, the score
// transform then a run-time switch (one instantiation for both); the sink is a run-time epilogue
// option of every variant.
// Is_sparse (params.h's block mask, padded batches, block_m a multiple of kBM and block_n of
// kBN; list_cap > 0; with Has_dropout, dropout too is a run-time switch, as the score
// transform): the producer warpgroup's second warp lists each tile's kernel key blocks (its
// mask query block's kept key blocks, split into kBN tiles, that meet the visible keys;
// block_sparse_tiles.cuh) in one of two shared-memory lists in turn, past the mbarriers
// (fwd_sparse_smem_bytes), up to two tiles ahead; the loading thread and the consumers walk
// that list where they walk the key blocks down otherwise, and release it (its empty
// mbarrier counts them all). A tile with an empty list writes O = 0 and lse = -inf (the sink).
// tma_o (kTmaO shapes, padded calls: launch_fwd_sm90_kernel): each consumer stages its O rows
// in shared memory and its thread 0 stores them with TMA, waiting for the store's read only
// before the next tile's epilogue (and at the end).
template <class Cfg, typename Element, bool Has_score_mod, bool Has_dropout, bool Is_sparse,
          bool kCells>
__device__ __forceinline__ void fwd_body_sm90(const FwdParams& p, const FwdMaps& maps, int group,
                                              int deal, int list_cap, int tma_o,
                                              int o_halves) {
  constexpr int kBM = Cfg::kBM, kBN = Cfg::kBN, kD = Cfg::kD, kDv = Cfg::kDv;
  constexpr int kStages = Cfg::kStages, kNC = Cfg::kConsumers, kSchedule = Cfg::kSchedule;
  constexpr int kSN = kBN / 8, kON = kDv / 8;  // n8 blocks of S and of O per thread
  constexpr int kFmaMod = Cfg::kExpFma > 0 ? Cfg::kExpFma : 1;  // (no % 0 when off)
  constexpr bool kFp8 = Cfg::kFp8;
  static_assert(!kFp8 || (!Has_dropout && !Is_sparse), "the API refuses FP8 with these");
  // A operand of P V: k16 (16-bit) or k32 (e4m3) slabs of P, four registers each.
  constexpr int kPK = kFp8 ? kBN / 32 : kBN / 16;
  // setmaxnreg moves registers within the CTA's pool (kThreads x the launch's per-thread
  // count, 168 at 384 threads): the roles' sum may not exceed it, or an increase waits for
  // ever. The block-sparse list warp spills at 24: there 40 + 2 x 232.
  constexpr int kProducerRegs = Is_sparse && kNC == 2 ? 40 : Cfg::kProducerRegs;
  constexpr int kConsumerRegs = Is_sparse && kNC == 2 ? 232 : Cfg::kConsumerRegs;
  static_assert(kProducerRegs + kNC * kConsumerRegs <= (kNC + 1) * ((65536 / Cfg::kThreads) & ~7),
                "the roles' registers fit the CTA's pool");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Cfg::kSmemBar);
  uint64_t* q_empty = q_full + 1;
  uint64_t* k_full = q_full + 2;
  uint64_t* k_empty = k_full + kStages;
  uint64_t* v_full = k_empty + kStages;
  uint64_t* v_empty = v_full + kStages;
  uint64_t* vraw_full = v_empty + kStages;  // kVChip: the raw V ring
  uint64_t* vraw_empty = vraw_full + kStages;
  constexpr bool kVChip = Cfg::kVChip;
  constexpr int kTransposers = kVtTransposers;  // kVChip: warps 1-3 of the producer warpgroup
  static_assert(kTransposers == 128 - 32, "the producer warpgroup's threads t >= 32 transpose");
  // Block-sparse: list_full / list_empty [2], list_count [2], then lists [2][list_cap].
  constexpr bool sparse = Is_sparse;
  uint64_t* list_full = reinterpret_cast<uint64_t*>(smem + Cfg::kSmemBar + 128);
  uint64_t* list_empty = list_full + 2;
  int* list_count = reinterpret_cast<int*>(list_full + 4);
  int* lists = reinterpret_cast<int*>(smem + Cfg::kSmemBar + 128 + 64);
  // The loading thread and the consumers take each tile's list in turn (`uses` counts them):
  // its count, its shared address into `list`; release_list(uses) when read no more.
  auto take_list = [&](int& uses, uint32_t& list) {
    const int buf = uses & 1;
    mbar_wait(list_full + buf, (uses >> 1) & 1);
    ++uses;
    list = smem_u32(lists + buf * list_cap);
    return list_count[buf];
  };
  auto release_list = [&](int uses) { mbar_arrive(list_empty + ((uses - 1) & 1)); };
  // The key block of a tile's iteration it: listed (block-sparse), else from the last down.
  auto key_block = [&](const FwdTileInfo& ti, uint32_t list, int it) {
    if constexpr (sparse) return ld_shared_s32(list + 4 * it);
    else return ti.kbl.hi - 1 - it;
  };
  const int m_blocks = (p.seqlen_q + kBM - 1) / kBM;
  const int num_tiles = m_blocks * p.nheads * p.batch;
  const int wg = Cfg::kDescBase ? __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0)
                                : int(threadIdx.x / 128);
  const int t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, kNC * 128);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(v_full + s, kVChip ? kTransposers : 1);
      if (kVChip) {
        mbar_init(vraw_full + s, 1);
        mbar_init(vraw_empty + s, kTransposers);
      }
      mbar_init(k_empty + s, kNC * 128);  // every consumer thread
      mbar_init(v_empty + s, kNC * 128);
    }
    if (sparse)
      for (int i = 0; i < 2; ++i) {
        mbar_init(list_full + i, 1);
        mbar_init(list_empty + i, kNC * 128 + 1);  // the consumers and the loading thread
      }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // producer: one thread issues every copy (block-sparse: warp 1 lists)
    setmaxnreg_dec<kProducerRegs>();
    if constexpr (sparse) {
      if (t / 32 == 1) {  // the lists, for the tiles the consumers take (empty ones too)
        const int lane = t % 32;
        int list_uses = 0;
        for (int k = 0;; ++k) {
          const int tile = fwd_tile_of(k, blockIdx.x, gridDim.x, num_tiles, m_blocks, deal);
          if (tile == kNoTile) break;
          if (tile == kSkipTile) continue;
          const FwdTileInfo ti = fwd_tile_info<kBM, kBN>(p, tile, m_blocks, group);
          if (ti.m0 >= ti.si.seqlen_q) continue;
          const int buf = list_uses & 1, use = list_uses >> 1;
          ++list_uses;
          if (use > 0) mbar_wait(list_empty + buf, (use - 1) & 1);
          const SparseAxes axes{p.kv_num_blocks, p.kv_indices,
                                ti.b * p.bs_batch_stride + ti.h * p.bs_head_stride,
                                p.n_qblocks, p.n_kblocks, p.block_m, p.block_n};
          const int cnt = build_sparse_tiles<kBM, kBN>(axes, ti.m0, ti.si.seqlen_q, ti.kbl.lo,
                                                       ti.kbl.hi, lists + buf * list_cap,
                                                       nullptr, list_cap, lane);
          __syncwarp();  // the lanes' entries before the arrive (release) publishes them
          if (lane == 0) {
            list_count[buf] = min(cnt, list_cap);
            mbar_arrive(list_full + buf);
          }
        }
        return;
      }
    }
    if constexpr (kVChip) {
      if (t >= 32) {
        fwd_transpose_v<Cfg>(p, smem, vraw_full, vraw_empty, v_full, v_empty, t - 32, num_tiles,
                             m_blocks, group, deal);
        return;
      }
    }
    if (t != 0) return;
    int kv_count = 0, q_count = 0;  // K / V iterations and Q loads so far
    int list_uses = 0;              // block-sparse lists taken
    for (int k = 0;; ++k) {
      const int tile = fwd_tile_of(k, blockIdx.x, gridDim.x, num_tiles, m_blocks, deal);
      if (tile == kNoTile) break;
      if (tile == kSkipTile) continue;
      const FwdTileInfo ti = fwd_tile_info<kBM, kBN>(p, tile, m_blocks, group);
      int n_iters = ti.n_iters;
      uint32_t list_addr = 0;  // block-sparse: this tile's list
      if constexpr (sparse) {
        if (ti.m0 >= ti.si.seqlen_q) continue;
        n_iters = take_list(list_uses, list_addr);
        if (n_iters == 0) {
          release_list(list_uses);
          continue;
        }
      }
      if (n_iters == 0) continue;
      const int tb = p.is_varlen ? 0 : ti.b;  // TMA rows: q_row0 / k_row0 + r
      const int q_row = static_cast<int>(ti.si.q_row0) + ti.m0;
      const int k_row = static_cast<int>(ti.si.k_row0);
      // FP8: the sequence's first V^T column (fp8_layout_sm90.h; 0 when padded).
      const int vt_col = kFp8 && p.is_varlen ? static_cast<int>(vt_seq_col0(ti.si.k_row0, ti.b)) : 0;
      auto load = [&](uint8_t* dst, const CUtensorMap* map, uint64_t* bar, int col, int row,
                      int head) {
        if (p.is_varlen) tma_load_3d(dst, map, bar, col, row, head);
        else tma_load_4d(dst, map, bar, col, row, head, tb);
      };
      auto load_q = [&] {
        if (q_count > 0) mbar_wait(q_empty, (q_count - 1) & 1);  // the last tile's S are done
        mbar_arrive_expect_tx(q_full, Cfg::kQBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kQKChunks; ++c)
          load(smem + c * Cfg::kQChunk, &maps.q, q_full, c * Cfg::kQKChunkCols, q_row, ti.h);
        ++q_count;
      };
      // K or V of the tile's iteration it, into ring slot kv_count + it once it is free.
      auto load_kv = [&](bool is_k, int it) {
        const int slot = kv_count + it, stage = slot % kStages, use = slot / kStages;
        const int n0 = key_block(ti, list_addr, it) * kBN;
        // (kVChip: V into the raw ring, whose empty barrier the transposing warps arrive on.)
        uint64_t* full = (is_k ? k_full : kVChip ? vraw_full : v_full) + stage;
        if (use > 0)
          mbar_wait((is_k ? k_empty : kVChip ? vraw_empty : v_empty) + stage, (use - 1) & 1);
        mbar_arrive_expect_tx(full, is_k ? Cfg::kKBytes : Cfg::kVBytes);
        uint8_t* dst = smem + (is_k ? Cfg::kSmemK + stage * Cfg::kKBytes
                               : kVChip ? Cfg::kSmemVRaw + stage * Cfg::kVBytes
                                        : Cfg::kSmemV + stage * Cfg::kVBytes);
        if (is_k) {
#pragma unroll
          for (int c = 0; c < Cfg::kQKChunks; ++c)
            load(dst + c * Cfg::kKChunk, &maps.k, full, c * Cfg::kQKChunkCols, k_row + n0, ti.hk);
        } else if constexpr (kVChip) {  // V as it lies: boxes of kVRawChunkB columns x kBN keys
#pragma unroll
          for (int c = 0; c < Cfg::kVRawChunks; ++c)
            load(dst + c * Cfg::kVRawChunk, &maps.v, full, c * Cfg::kVRawChunkB, k_row + n0,
                 ti.hk);
        } else if constexpr (kFp8) {  // V^T: (key, head-dim column) boxes of kVChunkB x kDv
#pragma unroll
          for (int c = 0; c < Cfg::kVChunks; ++c)
            load(dst + c * Cfg::kVChunk, &maps.v, full, vt_col + n0 + Cfg::kVChunkB * c, 0, ti.hk);
        } else {
#pragma unroll
          for (int c = 0; c < Cfg::kVChunks; ++c)
            load(dst + c * Cfg::kVChunk, &maps.v, full, c * 64, k_row + n0, ti.hk);
        }
      };
      // K_0, Q, then (K_j+1, V_j), then the last V: the order the overlapped consumers take
      // them in (FA3's). The former K_j, V_j order measured the same (NOTES.md, 2026-12-02).
      load_kv(true, 0);
      load_q();
      for (int it = 1; it < n_iters; ++it) {
        load_kv(true, it);
        load_kv(false, it - 1);
      }
      load_kv(false, n_iters - 1);
      kv_count += n_iters;
      if constexpr (sparse) release_list(list_uses);
    }
    return;
  }

  setmaxnreg_inc<kConsumerRegs>();
  const int c = wg - 1, warp = t / 32, lane = t % 32;
  const bool score_mod_on =
      Has_score_mod || (Has_dropout && (p.softcap > 0.f || p.alibi_slopes != nullptr ||
                                        !(p.softmax_scale > 0.f)));
  const float scale_log2_call = score_mod_on ? 1.4426950408889634f : p.softmax_scale_log2;
  // FP8: per tile, the descales of its (sequence, KV head) folded in (params.h): q_descale
  // k_descale into the scale of S, v_descale into the epilogue's factor.
  float scale_log2 = scale_log2_call, mod_scale = p.softmax_scale, v_scale = 1.f;
  bool fp8_scaled = false;
  // The sparse kernel with Has_dropout also runs score-transform calls without dropout, whose
  // rng_state is null: nothing reads it then.
  const bool drop_on = Has_dropout && (!Is_sparse || p.dropout_threshold > 0);
  DropoutRng rng{};
  if constexpr (Has_dropout)
    if (drop_on) rng = dropout_rng(p.rng_state, p.dropout_threshold, 0, 0, 0, 0);
  const bool has_cap = p.softcap > 0.f;
  const float cap = p.softcap, inv_cap = has_cap ? 1.f / p.softcap : 0.f;
  const uint32_t q_base = smem_u32(smem) + c * 64 * Cfg::kQKChunkB;  // this warpgroup's 64 rows
  int kv_base = 0, q_count = 0, list_uses = 0;  // as the producer counts them
  float s[kBN / 2];        // S (then P) of the current key block
  for (int k = 0;; ++k) {
    const int tile = fwd_tile_of(k, blockIdx.x, gridDim.x, num_tiles, m_blocks, deal);
    if (tile == kNoTile) break;
    if (tile == kSkipTile) continue;
    const FwdTileInfo ti = fwd_tile_info<kBM, kBN>(p, tile, m_blocks, group);
    if (ti.m0 >= ti.si.seqlen_q) continue;  // varlen: past this sequence
    int n_iters = ti.n_iters;
    uint32_t list_addr = 0;  // block-sparse: this tile's list (warp 1 of the producers')
    if constexpr (sparse) n_iters = __shfl_sync(0xffffffffu, take_list(list_uses, list_addr), 0);
    if constexpr (Has_dropout)
      rng.b = ti.b, rng.h = ti.h, rng.qo = q_pos_of(p, ti.b), rng.ko = k_pos_of(p, ti.b);
    if constexpr (kFp8) {
      const float qk = descale_of(p.q_descale_ptr, p.q_descale_batch_stride, ti.b, ti.hk) *
                       descale_of(p.k_descale_ptr, p.k_descale_batch_stride, ti.b, ti.hk);
      mod_scale = p.softmax_scale * qk;
      // A product <= 0 (or NaN) of the scale and the descales: S scaled before the max, as the
      // score-transform kernels do (the max of raw q.k is not the max of the scores then).
      fp8_scaled = !score_mod_on && !(mod_scale > 0.f);
      scale_log2 = score_mod_on || fp8_scaled ? scale_log2_call : scale_log2_call * qk;
      if (fp8_scaled) scale_log2 = 1.4426950408889634f;
      v_scale = descale_of(p.v_descale_ptr, p.v_descale_batch_stride, ti.b, ti.hk);
    }
    const int row0 = ti.m0 + c * 64 + warp * 16 + lane / 4;  // this thread's rows: +0, +8
    int kb[2], ke[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      kb[r] = ti.mi.key_begin(row0 + 8 * r);
      ke[r] = ti.mi.key_end(row0 + 8 * r);
    }
    float o[kDv / 2], row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
    float alpha[2];
    // FLASHATTN_SM90_SKIP_RESCALE (fwd_config_sm90.cuh): 1 the FP8 kernels, 2 all but dropout's
    // (ptxas: the d 128 block-sparse variant then spills 84 bytes, not 12; d 256 plain 8, not 0).
    constexpr bool kSkipRescale = FLASHATTN_SM90_SKIP_RESCALE >= (kFp8 ? 1 : 2) && !Has_dropout;
    uint32_t pa[kPK][4], pb[kPK][4];
#pragma unroll
    for (int i = 0; i < kDv / 2; ++i) o[i] = 0.f;

    auto wait_k = [&](int it) {
      mbar_wait(k_full + (kv_base + it) % kStages, ((kv_base + it) / kStages) & 1);
    };
    auto wait_v = [&](int it) {
      mbar_wait(v_full + (kv_base + it) % kStages, ((kv_base + it) / kStages) & 1);
    };
    auto release_v = [&](int it) { mbar_arrive(v_empty + (kv_base + it) % kStages); };
    // S of iteration it is in registers: its K stage is free, and after the tile's last S
    // so is Q (the producer may load the next tile's).
    auto s_done = [&](int it) {
      mbar_arrive(k_empty + (kv_base + it) % kStages);
      if (it == n_iters - 1) mbar_arrive(q_empty);
    };
    // Ping-pong: warpgroup c issues its MMAs between sync(1 + c) and an arrive on the next
    // one's barrier (a ring); each barrier counts two warpgroups (256 threads).
    auto turn_begin = [&] {
      if constexpr (kSchedule == kPingPong) named_bar_sync(1 + c, 256);
    };
    auto turn_end = [&] {
      if constexpr (kSchedule == kPingPong) named_bar_arrive(1 + (c + 1) % kNC, 256);
    };
    // The descriptor of the matrix at base + off (lbo: sw128's; sbo 1024): built at base + off,
    // or (kDescBase) built at base, which the compiler keeps across the k-steps, and moved.
    auto desc_at = [](uint32_t base, uint32_t off, uint32_t lbo) {
      return Cfg::kDescBase ? desc_add(gmma_desc_sw128(base, lbo, 1024), off)
                            : gmma_desc_sw128(base + off, lbo, 1024);
    };
    // FP8's descriptors: K-major rows of kSw bytes (sbo: 8 of them).
    auto desc_fp8 = [](uint32_t addr, auto sw) {
      constexpr int kSw = decltype(sw)::value;
      return gmma_desc_swz<kSw>(addr, 16, 8 * kSw);
    };
    using QKSw = std::integral_constant<int, Cfg::kQKChunkB>;
    auto issue_qk = [&](int it) {  // S = Q K^T of iteration it (its K has landed)
      const uint32_t k_base =
          smem_u32(smem + Cfg::kSmemK + ((kv_base + it) % kStages) * Cfg::kKBytes);
      wgmma_fence();
      if constexpr (kFp8) {
        constexpr int kSteps = Cfg::kQKChunkB / 32;  // k32 steps of a chunk's rows
#pragma unroll
        for (int kk = 0; kk < kD / 32; ++kk) {
          const uint32_t in_row = (kk % kSteps) * 32;
          wgmma_ss_e4m3(s, desc_fp8(q_base + (kk / kSteps) * Cfg::kQChunk + in_row, QKSw{}),
                        desc_fp8(k_base + (kk / kSteps) * Cfg::kKChunk + in_row, QKSw{}), kk > 0);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
          const uint32_t in_row = (kk % 4) * 32;  // 16 columns of a 128-byte row
          wgmma_ss<false, Element>(s, desc_at(q_base, (kk / 4) * Cfg::kQChunk + in_row, 16),
                                   desc_at(k_base, (kk / 4) * Cfg::kKVChunk + in_row, 16), kk > 0);
        }
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int it, const uint32_t (&a)[kPK][4]) {
      const uint32_t v_base =
          smem_u32(smem + Cfg::kSmemV + ((kv_base + it) % kStages) * Cfg::kVBytes);
      wgmma_fence();
      if constexpr (kFp8) {  // 32 keys = 32 bytes of each V^T row
        constexpr int kSteps = Cfg::kVChunkB / 32;
#pragma unroll
        for (int kk = 0; kk < kBN / 32; ++kk)
          wgmma_rs_e4m3(o, a[kk],
                        desc_fp8(v_base + (kk / kSteps) * Cfg::kVChunk + (kk % kSteps) * 32,
                                 std::integral_constant<int, Cfg::kVChunkB>{}),
                        1);
      } else {
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk)  // 16 keys = 16 rows of 128 bytes
          wgmma_rs<true, Element>(o, a[kk], desc_at(v_base, kk * 16 * 128, Cfg::kKVChunk), 1);
      }
      wgmma_commit();
    };
    // Masks S of iteration it, updates the row max and sums (alpha: the factor O still
    // needs), leaves P = exp2(S * scale - max) in s; its first key n0.
    auto scores = [&](int it, int n0_pre = -1) {
      const int n0 = n0_pre >= 0 ? n0_pre : key_block(ti, list_addr, it) * kBN;
      if constexpr (kFp8 && !Has_score_mod && !Has_dropout) {
        // The plain FP8 kernel's scale <= 0 case (a non-positive descale product): the scale
        // on each score before the max, nothing else (no softcap or ALiBi here), so that the
        // hot loop does not carry score_mod's cold code (a helper's SASS reading, 2026-12-06).
        if (fp8_scaled)
#pragma unroll
          for (int i = 0; i < kSN * 4; ++i) s[i] *= mod_scale;
      } else if (Has_score_mod || (Has_dropout && score_mod_on) || (kFp8 && fp8_scaled)) {
        const float slope = alibi_slope(p, ti.b, ti.h);
        const int diag = row0 + ti.mi.shift() - n0 - (lane % 4) * 2;
#pragma unroll
        for (int j = 0; j < kSN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[j * 4 + e] = score_mod(s[j * 4 + e] * (kFp8 ? mod_scale : p.softmax_scale), has_cap,
                                     cap, inv_cap, slope,
                                     diag + 8 * (e >> 1) - j * 8 - (e & 1));
      }
      if (n0 < kb[0] || n0 < kb[1] || n0 + kBN > ke[0] || n0 + kBN > ke[1]) {
#pragma unroll
        for (int j = 0; j < kSN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n0 + j * 8 + (lane % 4) * 2 + (e & 1), r = e >> 1;
            if (col < kb[r] || col >= ke[r]) s[j * 4 + e] = -INFINITY;
          }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // 4 lanes share a row
        // Row max and sum over 4 independent chains (n8 block j feeds chain j % 4), tree-joined;
        // one serial chain measured the same (interleaved and cold: NOTES.md 2026-12-02).
        constexpr int kC = kSN < 4 ? kSN : 4;
        float mxc[kC], sc[kC];
        // FLASHATTN_SM90_FWD_SEED_CHAINS (fwd_config_sm90.cuh): chains 1.. start from their
        // first n8 block's values, not from -inf / 0 (the same results; 7 instructions a row).
        constexpr bool kSeed = FLASHATTN_SM90_FWD_SEED_CHAINS != 0;
#pragma unroll
        for (int q = 0; q < kC; ++q) {
          const float first = fmaxf(s[q * 4 + 2 * r], s[q * 4 + 2 * r + 1]);
          mxc[q] = q == 0 ? fmaxf(row_max[r], first) : kSeed ? first : fmaxf(-INFINITY, first);
          sc[q] = 0.f;
        }
#pragma unroll
        for (int j = kC; j < kSN; ++j)
          mxc[j % kC] = fmaxf(mxc[j % kC], fmaxf(s[j * 4 + 2 * r], s[j * 4 + 2 * r + 1]));
#pragma unroll
        for (int w = 1; w < kC; w *= 2)
#pragma unroll
          for (int q = 0; q + w < kC; q += 2 * w) mxc[q] = fmaxf(mxc[q], mxc[q + w]);
        float mx = mxc[0];
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        // -inf guards: a row with nothing visible yet keeps max -inf and P = 0 (exp2(-inf)).
        const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
        alpha[r] = row_max[r] == -INFINITY         ? 0.f
                   : kSkipRescale && mx == row_max[r] ? 1.f
                   : exp2_ftz(row_max[r] * scale_log2 - m_scaled);
        row_max[r] = mx;
        const float m_sub = kFp8 ? m_scaled - kFp8PLog2 : m_scaled;  // FP8: P~ = 2^8 P
#pragma unroll
        for (int j = 0; j < kSN; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = fmaf(s[j * 4 + 2 * r + e], scale_log2, -m_sub);
            const float pv = Cfg::kExpFma > 0 && j % kFmaMod == kFmaMod - 1 ? exp2_fma(x)
                                                                             : exp2_ftz(x);
            s[j * 4 + 2 * r + e] = pv;
            if (kSeed && j < kC && e == 0) sc[j % kC] = pv;  // the chain's first term
            else sc[j % kC] += pv;
          }
#pragma unroll
        for (int w = 1; w < kC; w *= 2)
#pragma unroll
          for (int q = 0; q + w < kC; q += 2 * w) sc[q] += sc[q + w];
        row_sum[r] = row_sum[r] * alpha[r] + sc[0];
      }
      return n0;
    };
    // Packs P (in s) of the key block at n0 into `a`, the A operand of P V (dropout's Z on it).
    auto pack_p = [&](int n0, uint32_t (&a)[kPK][4]) {
      if constexpr (kFp8) {
        // k32 slab kk = n8 blocks 4 kk .. 4 kk + 3, no shuffle: the slab's keys in the order
        // the staging pass wrote V^T's columns in (fp8_layout_sm90.h's fp8_pack_idx, vt_key_of).
#pragma unroll
        for (int kk = 0; kk < kBN / 32; ++kk) {
          const float* s0 = s + 16 * kk;
#pragma unroll
          for (int r = 0; r < 4; ++r)
            a[kk][r] = pack_e4m3_x4(s0[fp8_pack_idx(r, 0)], s0[fp8_pack_idx(r, 1)],
                                    s0[fp8_pack_idx(r, 2)], s0[fp8_pack_idx(r, 3)]);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) {
          const float* s0 = s + 8 * kk;  // n8 blocks 2 kk and 2 kk + 1
          a[kk][0] = pack_x2<Element>(s0[0], s0[1]);
          a[kk][1] = pack_x2<Element>(s0[2], s0[3]);
          a[kk][2] = pack_x2<Element>(s0[4], s0[5]);
          a[kk][3] = pack_x2<Element>(s0[6], s0[7]);
        }
      }
      // Dropout: the sums above are the undropped softmax's (params.h); Z zeroes what P V
      // sees (1 / (1 - p) at the end), on the packed P: a[kk][x] holds columns 2t, 2t + 1 of
      // n8 block 2 kk + (x >> 1), row half x & 1, whose keep bytes are 2 (x >> 1) and + 1 of
      // that half's word: dropout_kept16 makes their 16-bit masks directly (the default;
      // FLASHATTN_SM90_DROPOUT_HSET2=0 builds the byte-permute widening instead,
      // dropout_lanes.cuh). Lanes pair 16-column blocks
      // (dropout_lanes.cuh); an odd count's last block is drawn by both lanes of a pair.
      if constexpr (Has_dropout) if (drop_on) {
        constexpr int kNB = kBN / 16;
        const int I = (ti.m0 + c * 64 + warp * 16) >> 4, J0 = n0 >> 4;
        auto apply = [&](int kk, const uint32_t (&w)[2]) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
#if FLASHATTN_SM90_DROPOUT_HSET2
            uint32_t m01, m23;
            dropout_kept16(rng, w[half], m01, m23);
            a[kk][half] &= m01;
            a[kk][2 + half] &= m23;
#else
            const uint32_t kept = dropout_kept4(rng, w[half]);  // 0xff per kept byte
            a[kk][half] &= __byte_perm(kept, 0u, 0x1100u);
            a[kk][2 + half] &= __byte_perm(kept, 0u, 0x3322u);
#endif
          }
        };
#pragma unroll
        for (int pp = 0; pp < kNB / 2; ++pp) {
          uint32_t wa[2], wb[2];
          dropout_words_s<kCells>(rng, I, J0 + 2 * pp, lane, wa, wb);
          apply(2 * pp, wa);
          apply(2 * pp + 1, wb);
        }
        if constexpr (kNB % 2 == 1) {
          uint32_t w1[2];
          dropout_words_s1<kCells>(rng, I, J0 + kNB - 1, lane, w1);
          apply(kNB - 1, w1);
        }
      }
    };
    auto softmax = [&](int it, uint32_t (&a)[kPK][4]) { pack_p(scores(it), a); };
    auto rescale_o = [&]() {
      if constexpr (kSkipRescale)  // no row of this warp moved its max
        if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
      for (int j = 0; j < kON; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j * 4 + e] *= alpha[e >> 1];
    };

    // Epilogue: O / rowsum in Element, columns below headdim_v (a multiple of 8); lse = max *
    // scale + ln(sum), -inf (and O = 0) for a row with no key; the sink joins the sum
    // (row_finish.h). tma_o (kTmaO kernels, padded calls): O through this warpgroup's staging
    // area and one TMA store per 64 columns (the tensor's extents clip rows past seqlen_q and
    // columns past headdim_v), issued by thread 0, which lets it run under the next tile;
    // else straight from registers (4-byte stores, half of each 32-byte sector).
    // Row r's sum over its quad, then lse and 1 / sum (row_finish.h; every lane, before any
    // row test: the shuffles take the whole warp).
    auto finish = [&](int r, bool has_sink, float sink) {
      float sum = row_sum[r];
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      // (FP8: the row sum is 2^8 times P's, so its log 8 ln 2 too much, and v_descale.)
      const float m_nat = kFp8 ? (row_max[r] * scale_log2 - kFp8PLog2) * 0.6931471805599453f
                               : row_max[r] * scale_log2 * 0.6931471805599453f;
      return finish_row(sum, m_nat, has_sink, sink,
                        Has_dropout ? p.dropout_scale : kFp8 ? v_scale : 1.f);
    };
    auto epilogue_tma = [&] {
      float* lse =
          p.lse_ptr + ti.b * p.lse_batch_stride + ti.h * p.lse_head_stride + ti.si.q_row0;
      const bool has_sink = p.sink_ptr != nullptr;  // params.h; row_finish.h
      const float sink = has_sink ? p.sink_ptr[ti.h] : 0.f;
      const uint32_t o_smem = smem_u32(smem + Cfg::kSmemO) + c * (64 * kDv * 2);
      if (t == 0) bulk_wait_read<0>();  // the last tile's store has read the area
      __syncwarp();                      // (bar.sync is warp-aligned)
      named_bar_sync(Cfg::kBarO + c, 128);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const RowFinish fin = finish(r, has_sink, sink);
        // Row warp * 16 + g + 8 r of the area; n8 block j is 16-byte unit j % 8 of chunk j / 8,
        // swizzled by the row's index mod 8 (= g): 32 lanes, 32 banks.
        const int g = lane / 4;
        const uint32_t row_addr = o_smem + (warp * 16 + g + 8 * r) * 128 + (lane % 4) * 4;
#pragma unroll
        for (int j = 0; j < kON; ++j)
          sts_u32(row_addr + (j / 8) * Cfg::kOChunk + (((j % 8) ^ g) * 16),
                  pack_x2<Element>(o[j * 4 + 2 * r] * fin.inv, o[j * 4 + 2 * r + 1] * fin.inv));
        const int row = row0 + 8 * r;
        if (row < ti.si.seqlen_q && lane % 4 == 0) lse[row] = fin.lse;
      }
      fence_async_shared();  // this thread's stores, for the async proxy's read
      named_bar_sync(Cfg::kBarO + c, 128);
      if (t == 0) {  // (the next named_bar_sync follows this thread's __syncwarp above)
#pragma unroll
        for (int j = 0; j < kDv / 64; ++j)
          if (64 * j < p.headdim_v)
            tma_store_4d(&maps.o, o_smem + j * Cfg::kOChunk, 64 * j, ti.m0 + c * 64, ti.h, ti.b);
        bulk_commit();
      }
    };
    auto epilogue = [&] {
      if constexpr (Cfg::kTmaO) {
        if (tma_o) {
          epilogue_tma();
          return;
        }
      }
      Element* out = static_cast<Element*>(p.o_ptr) + ti.b * p.o_batch_stride +
                     ti.h * p.o_head_stride + ti.si.q_row0 * p.o_row_stride;
      float* lse =
          p.lse_ptr + ti.b * p.lse_batch_stride + ti.h * p.lse_head_stride + ti.si.q_row0;
      const int dv_blocks = p.headdim_v / 8;
      const bool has_sink = p.sink_ptr != nullptr;  // params.h; row_finish.h
      const float sink = has_sink ? p.sink_ptr[ti.h] : 0.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const RowFinish fin = finish(r, has_sink, sink);
        const int row = row0 + 8 * r;
        if (row >= ti.si.seqlen_q) continue;
        const float inv = fin.inv;
        Element* orow = out + row * p.o_row_stride + (lane % 4) * 2;
        if constexpr (kFp8) {
          if (o_halves) {  // any head dim and strides: element by element
#pragma unroll
            for (int j = 0; j < kON; ++j)
#pragma unroll
              for (int e = 0; e < 2; ++e)
                if (j * 8 + (lane % 4) * 2 + e < p.headdim_v)
                  orow[j * 8 + e] = Element(o[j * 4 + 2 * r + e] * inv);
            if (lane % 4 == 0) lse[row] = fin.lse;
            continue;
          }
        }
#pragma unroll
        for (int j = 0; j < kON; ++j)
          if (j < dv_blocks)
            *reinterpret_cast<uint32_t*>(orow + j * 8) =
                pack_x2<Element>(o[j * 4 + 2 * r] * inv, o[j * 4 + 2 * r + 1] * inv);
        if (lane % 4 == 0) lse[row] = fin.lse;
      }
    };
    if (n_iters > 0) {
      // Turns: S_0; then (S_{j+1}, P_j V_j) for j < n - 1; then P_{n-1} V_{n-1}. The last
      // warpgroup lets warpgroup 0 take the first turn and skips its own last arrive, so
      // every sync has its arrive and none is left over when the tile ends.
      mbar_wait(q_full, q_count & 1);
      if (kSchedule == kPingPong && c == kNC - 1) named_bar_arrive(1, 256);
      wait_k(0);
      turn_begin();
      issue_qk(0);
      turn_end();
      wgmma_wait<0>();
      wgmma_fence_operands(s);
      s_done(0);
      softmax(0, pa);
      // Two P buffers in turn (no copy the register allocator could fold into one), and
      // each step's MMAs in straight-line code: otherwise ptxas serialises the MMAs (C7513 /
      // C7514) because it cannot see that wait<1> retires S while P V still reads P.
      // One P buffer, packed after P V's wait (the 3-consumer FP8 tile; any under
      // FLASHATTN_SM90_FWD_ONE_P).
      constexpr bool kOneP = Cfg::kOneP || FLASHATTN_SM90_FWD_ONE_P != 0;
      auto step = [&](int it, const uint32_t (&cur)[kPK][4], uint32_t (&nxt)[kPK][4]) {
        const int n0_pre = key_block(ti, list_addr, it + 1) * kBN;  // before the waits
        wait_k(it + 1);
        if constexpr (!Cfg::kVLate) wait_v(it);
        turn_begin();
        issue_qk(it + 1);
        if constexpr (Cfg::kVLate) wait_v(it);
        issue_pv(it, cur);
        turn_end();
        wgmma_wait<1>();
        wgmma_fence_operands(s);
        s_done(it + 1);
        int n0_next = 0;
        if constexpr (FLASHATTN_SM90_FWD_WAIT_EARLY != 0) {  // fwd_config_sm90.cuh
          wgmma_wait<0>();
          wgmma_fence_operands(o);
        }
        if constexpr (kOneP) n0_next = scores(it + 1, n0_pre);
        else pack_p(scores(it + 1, n0_pre), nxt);
        if constexpr (FLASHATTN_SM90_FWD_SPLIT == 2) {  // never taken: row sums are >= 0
          if (row_sum[0] + row_sum[1] < -1.f) __trap();
        }
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        release_v(it);
        if constexpr (kOneP) pack_p(n0_next, nxt);  // nxt is cur: P V_it has read it
        rescale_o();
      };
      auto last = [&](int it, const uint32_t (&cur)[kPK][4]) {
        wait_v(it);
        turn_begin();
        issue_pv(it, cur);
        if (c != kNC - 1) turn_end();
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        release_v(it);
      };
      uint32_t (&pb_)[kPK][4] = kOneP ? pa : pb;  // kOneP: one buffer, packed late
      for (int it = 0;; it += 2) {
        if (it + 1 >= n_iters) { last(it, pa); break; }
        step(it, pa, pb_);
        if (it + 2 >= n_iters) { last(it + 1, pb_); break; }
        step(it + 1, pb_, pa);
      }
      ++q_count;
      kv_base += n_iters;
    }
    if constexpr (sparse) release_list(list_uses);  // read no more

    epilogue();
  }
  if (Cfg::kTmaO && tma_o && t == 0) bulk_wait<0>();  // the area outlives the last store
}

// The kernel: the body above, kCells its dropout mask path (dropout_lanes.cuh); a dropout call
// with position offsets launches both kernels and the one that does not match returns at once.
template <class Cfg, typename Element, bool Has_score_mod, bool Has_dropout = false,
          bool Is_sparse = false, bool kCells = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel_sm90(const __grid_constant__ FwdParams p, const __grid_constant__ FwdMaps maps,
                    int group, int deal, int list_cap, int tma_o, int o_halves) {
  if constexpr (Has_dropout) {
    if (dropout_cells_call(p) != kCells) return;
  }
  fwd_body_sm90<Cfg, Element, Has_score_mod, Has_dropout, Is_sparse, kCells>(
      p, maps, group, deal, list_cap, tma_o, o_halves);
}

}  // namespace flashattn::sm90
