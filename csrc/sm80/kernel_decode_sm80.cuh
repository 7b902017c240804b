// Split-KV attention for decoding over a KV cache (sm80+; the path of flash_attn_with_kvcache
// and of paged KV). Decoding reads the whole cache for a few query rows, so the limit is memory
// bandwidth, and the work is split two ways to keep every SM streaming:
// - the query heads of one KV group and the query tokens form the rows of one tile (row r is
//   token r / group, head hk * group + r % group), so each K / V byte is read once per group;
// - the keys of a (batch, KV head) split across CTAs (grid.y), each writing a normalised
//   partial output and its LSE that decode_combine_kernel merges (num_splits 1: straight out).
// Inside a CTA the 4 warps split the rows (kWarpsM, 16 rows each) and the keys of each 64-key
// block (kWarpsN = 4 / kWarpsM); the kWarpsN partial softmax states meet in shared memory at the
// end. K / V tiles stream through a kStages-deep cp.async ring (about 96 KB in flight per CTA);
// rows of a paged cache are gathered per row through the block table, whose entries travel
// through the same ring kStages - 1 blocks ahead of the rows they address. Every
// key index and batch index comes from seq_info and every page is clamped as page_of clamps
// it, so untrusted metadata gives wrong numbers at worst, never an out-of-bounds access.
#pragma once
#include "kernel_fwd_sm80.cuh"  // SmemTile, TileCopy, quad_max / quad_sum, the primitives

// Build switch (an A/B lever, 0 by default): the split kernel's K / V copies with an L2
// prefetch-size hint of 128 or 256 bytes (cp_async_16_pf), so each row's DRAM reads go out as
// whole blocks (d 128 bf16 rows are 256 bytes). tools/device/decode_patch_ab.sh times it.
#ifndef FLASHATTN_DECODE_L2_PF
#define FLASHATTN_DECODE_L2_PF 0
#endif

namespace flashattn::sm80 {

constexpr int decode_stages(int stage_bytes, int budget) {
  const int s = budget / stage_bytes;
  return s < 2 ? 2 : (s > 8 ? 8 : s);
}

// Shared memory of a decode tile of `rows` query rows, head dim d, bn keys per stage and a
// ring of about `budget` bytes: Q, the K / V stages, and (paged) a ring of block-table
// entries, one per 16 keys of a stage. DecodeTraits::kSmem; decode_plan's choice of tiles.
constexpr int decode_smem_bytes(int rows, int d, int bn, int budget) {
  const int stage = 2 * bn * d * 2, stages = decode_stages(stage, budget);
  return rows * d * 2 + stages * stage + stages * (bn / 16) * 4;
}

// kBN keys per stage, their ring about kRingBudget bytes. The default (64 keys, 96 KB: two CTAs
// per SM on Hopper / A100) needs up to 160 KB at d256; DecodeSmallSmem is the variant for
// GPUs with 99 KB per block (sm_86 / sm_89), at most 96 KB at d256 (decode_plan picks it).
template <int kD_, typename Element_, int kWarpsM_, int kBN_ = 64, int kRingBudget = 98304>
struct DecodeTraits {
  using Element = Element_;
  static constexpr int kD = kD_, kWarpsM = kWarpsM_, kWarpsN = 4 / kWarpsM_;
  static constexpr int kThreads = 128;
  static constexpr int kM = 16 * kWarpsM;    // rows of a tile
  static constexpr int kBN = kBN_;           // keys per pipeline stage
  static constexpr int kLog2BN = kBN_ == 32 ? 5 : (kBN_ == 64 ? 6 : (kBN_ == 128 ? 7 : -1));
  static_assert(kLog2BN > 0, "a power-of-two key block");
  static constexpr int kNW = kBN / kWarpsN;  // keys of a block per warp: 16, 32 or 64
  static constexpr int kNFragsS = kNW / 8, kKStepsPV = kNW / 16;
  static constexpr int kNFragsO = kD / 8, kKStepsQK = kD / 16;
  using TileQ = SmemTile<kM, kD>;
  using TileKV = SmemTile<kBN, kD>;
  using Copy = TileCopy<kBN, kD, kThreads>;
  static constexpr int kStageBytes = 2 * TileKV::kBytes;
  static constexpr int kStages = decode_stages(kStageBytes, kRingBudget);
  // After the loop shared memory (Q and the ring) holds the warps' partial states: per
  // warp-column, kM rows of kD fp32 (O) and 2 fp32 (max, sum); then per row the merged
  // log2-max and 1 / sum.
  static constexpr int kScratchO = kWarpsN * kM * kD * 4;
  static constexpr int kScratchBytes = kScratchO + kWarpsN * kM * 8 + kM * 8;
  // Paged: a ring of kStages slots of block-table entries, one per 16 keys of a block (page
  // sizes are multiples of 16), after the K / V ring.
  static constexpr int kTableGroups = kBN / 16;
  static constexpr int kSmem = decode_smem_bytes(kM, kD, kBN, kRingBudget);
  static_assert(kSmem == TileQ::kBytes + kStages * (kStageBytes + kTableGroups * 4),
                "Q, the K / V ring, the table ring");
  static_assert(kWarpsM == 1 || kWarpsM == 2 || kWarpsM == 4, "4 warps split rows x keys");
  static_assert(kNW >= 16 && kNW % 16 == 0, "a warp's keys are whole k16 steps");
  static_assert(kScratchBytes <= kSmem, "the merge scratch fits the tiles");
  static_assert(kSmem <= 227 * 1024, "opt-in shared memory per block");
};
template <int kD, typename Element>
using DecodeSmallSmem = DecodeTraits<kD, Element, 4, 32, 65536>;

// Launch-time facts of one decode call (host-computed).
struct DecodeArgs {
  int group;      // query heads per KV head
  int m_tiles;    // row tiles per (batch, KV head)
  int64_t rows_total;  // nheads * total_q: the partial outputs' row count (split mode)
  int dv_pitch;   // fp32 row pitch of a partial output (headdim_v rounded up to 4)
  int page_shift;  // log2(page_size) when it is a power of two, else -1 (paged only)
  bool vec_ok;    // 16-byte global accesses everywhere
  bool fast;      // vec_ok, and K and V rows exactly the tile's kD columns
  bool score_mod; // softcap / ALiBi / a non-positive scale
  bool pdl;       // the combine is a programmatic dependent launch (decode_launch_dependents)
};

// The partial output of (split, row id) in the workspace: O rows (dv_pitch fp32), then LSEs.
// Row id = h * total_q + q row (padded: b * seqlen_q + t; varlen: the sequence's first row + t).
__device__ __forceinline__ int64_t decode_row_id(const FwdParams& p, int h, int64_t q_row) {
  return h * p.total_q + q_row;
}

// Programmatic dependent launch (Hopper and later; only where the launch asks for it,
// DecodeArgs::pdl): the split kernel lets the combine be scheduled from its start, and the
// combine waits for the split kernel's completion (its partial outputs visible) before it
// reads them, so the combine's launch overlaps the split kernel instead of following it
// (launch_decode_sm80.cuh: on Hopper and later unless FLASHATTN_DECODE_PDL=0).
__device__ __forceinline__ void decode_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void decode_wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <typename T>
__global__ void __launch_bounds__(T::kThreads)
    decode_kernel_sm80(const __grid_constant__ FwdParams p, const DecodeArgs a) {
  using Element = typename T::Element;
  using TileQ = typename T::TileQ;
  using TileKV = typename T::TileKV;
  using Copy = typename T::Copy;
  constexpr int kD = T::kD, kM = T::kM, kBN = T::kBN, kNW = T::kNW, kStages = T::kStages;
  constexpr int kNFragsS = T::kNFragsS, kNFragsO = T::kNFragsO;

  extern __shared__ __align__(128) unsigned char smem[];
  if (a.pdl) decode_launch_dependents();
  const int mt = blockIdx.x % a.m_tiles;
  const int bh = blockIdx.x / a.m_tiles;
  const int hk = bh % p.nheads_k, b = bh / p.nheads_k;
  const int split = blockIdx.y, num_splits = gridDim.y;
  const SeqInfo seq = seq_info(p, b);
  const int rows = seq.seqlen_q * a.group;
  const int r0 = mt * kM;
  if (r0 >= rows) return;
  const MaskInfo mask = mask_info(p, seq);
  const int shift = mask.shift();

  // Key blocks of this split: the visible range of the tile's tokens, cut into num_splits.
  const int t_first = r0 / a.group, t_last = min(rows - 1, r0 + kM - 1) / a.group;
  const int key_lo = mask.key_begin(t_first), key_hi = mask.key_end(t_last);
  const int blk_lo = key_lo / kBN;
  const int blk_count = key_hi > key_lo ? (key_hi + kBN - 1) / kBN - blk_lo : 0;
  const int per_split = (blk_count + num_splits - 1) / num_splits;
  const int blk_begin = blk_lo + split * per_split;
  const int n_iters = max(0, min(blk_lo + blk_count, blk_begin + per_split) - blk_begin);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % T::kWarpsM, wn = warp / T::kWarpsM;
  const int g = lane >> 2, t4 = lane & 3;
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sKV = sQ + TileQ::kBytes;  // stage s: K at sKV + s * kStageBytes, then V

  // Q rows -> smem (zero past the tile's rows or the head dim).
  {
    const Element* q = static_cast<const Element*>(p.q_ptr);
    constexpr int kChunks = kD / 8;
    for (int idx = tid; idx < kM * kChunks; idx += T::kThreads) {
      const int rr = idx / kChunks, chunk = idx % kChunks, col = chunk * 8;
      const int r = r0 + rr;
      const int tok = r / a.group, h = hk * a.group + r % a.group;
      const bool ok = r < rows;
      const Element* src = q + b * p.q_batch_stride + (seq.q_row0 + tok) * p.q_row_stride +
                           h * p.q_head_stride + col;
      const uint32_t d = sQ + TileQ::offset(rr, chunk);
      if (a.vec_ok && col + 8 <= p.headdim) {
        cp_async_16(d, ok ? static_cast<const void*>(src) : p.q_ptr, ok);
      } else {
        copy_chunk_elementwise(d, src, ok, col, p.headdim);
      }
    }
  }

  // One key row's address in K (V): paged through the block table, else the (clamped) batch.
  // Paged: block X's table entries (the page of each 16 of its keys) are copied by cp.async in
  // the commit group of block X - (kStages - 1) into ring slot X % kStages, so they land as
  // that block does, kStages - 1 blocks before X's rows are issued from them (a table load
  // one block ahead stalled the ring's issue on its latency: paged ran at 0.63-0.68 of
  // contiguous, 2026-12-02). Entries are clamped into the pool where they are used.
  const bool paged = p.block_table != nullptr;
  const Element* k_head = static_cast<const Element*>(p.k_ptr) + hk * p.k_head_stride;
  const Element* v_head = static_cast<const Element*>(p.v_ptr) + hk * p.v_head_stride;
  const int row0 = tid / Copy::kThreadsPerRow, chunk0 = tid % Copy::kThreadsPerRow;
  const int32_t* table = paged ? p.block_table + b * p.block_table_batch_stride : nullptr;
  constexpr int kGroups = T::kTableGroups;
  const int tab_off = TileQ::kBytes + kStages * T::kStageBytes;
  int32_t* tab = reinterpret_cast<int32_t*>(smem + tab_off);
  auto table_slot = [&](int blk, int grp) {  // block blk's 16-key group grp: its table slot
    // Logical row (paged calls have k_row0 0); rows past the keys read a clamped slot.
    const int lr = static_cast<int>(seq.k_row0) + blk * kBN + grp * 16;
    const int slot = a.page_shift >= 0 ? lr >> a.page_shift : lr / p.page_size;
    return min(max(slot, 0), p.max_pages_per_seq - 1);
  };
  // A table without columns (max_pages_per_seq 0) is never read: its entries are 0 (then
  // clamped into the pool like any other).
  const bool has_table = paged && p.max_pages_per_seq > 0;
  auto copy_table = [&](int blk) {  // block blk's entries -> its ring slot, in this group
    if (tid < kGroups)
      cp_async_4(sQ + tab_off + ((blk % kStages) * kGroups + tid) * 4,
                 has_table ? static_cast<const void*>(table + table_slot(blk, tid)) : p.k_ptr,
                 has_table);
  };
  // The rows' offsets first, in straight-line loops per case (paged with a power-of-two page,
  // paged, contiguous), then the copies: with the paged test inside the unrolled row loop,
  // every row branched between the two address paths and its table load (LDS) sat on that
  // row's own chain to its copy (SASS, 2026-12-03); here a block's table loads issue together.
  auto row_offsets = [&](int blk, int64_t (&koff)[Copy::kRowIters],
                         int64_t (&voff)[Copy::kRowIters]) {
    if (paged) {
      const int* slot = tab + (blk % kStages) * kGroups;
      int page[Copy::kRowIters], in_page[Copy::kRowIters];
#pragma unroll
      for (int i = 0; i < Copy::kRowIters; ++i)
        page[i] = min(max(slot[(row0 + i * Copy::kRowsPerStep) >> 4], 0), p.num_pages - 1);
      const int lr0 = static_cast<int>(seq.k_row0) + blk * kBN + row0;
      if (a.page_shift >= 0) {
        const int mask = (1 << a.page_shift) - 1;
#pragma unroll
        for (int i = 0; i < Copy::kRowIters; ++i)
          in_page[i] = (lr0 + i * Copy::kRowsPerStep) & mask;
      } else {
#pragma unroll
        for (int i = 0; i < Copy::kRowIters; ++i)
          in_page[i] = (lr0 + i * Copy::kRowsPerStep) % p.page_size;
      }
#pragma unroll
      for (int i = 0; i < Copy::kRowIters; ++i) {
        koff[i] = int64_t(page[i]) * p.k_batch_stride + int64_t(in_page[i]) * p.k_row_stride;
        voff[i] = int64_t(page[i]) * p.v_batch_stride + int64_t(in_page[i]) * p.v_row_stride;
      }
    } else {
#pragma unroll
      for (int i = 0; i < Copy::kRowIters; ++i) {
        const int64_t lr = seq.k_row0 + blk * kBN + row0 + i * Copy::kRowsPerStep;
        koff[i] = seq.k_batch * p.k_batch_stride + lr * p.k_row_stride;
        voff[i] = seq.k_batch * p.v_batch_stride + lr * p.v_row_stride;
      }
    }
  };
  // The common case (a.fast: 16-byte aligned rows of exactly kD columns in K and V) in its own
  // straight-line form: a block's rows are one 64-bit base plus a constant step per row (a
  // paged block that lies inside one page reads one table entry), and every chunk is a bare
  // cp.async with no column test. The general form below the offsets of each row as above.
  // (A helper's SASS count, 2026-12-06: ~330 of a warp's ~870 instructions per block went to
  // the copies, ~175 more on paged calls.)
  // Up to d 128 (at d 192 / 256 the 16-row kernels spill 24-52 bytes with both forms in).
  const bool fast = a.fast && kD <= 128;
  const bool one_page = paged && a.page_shift >= T::kLog2BN && (seq.k_row0 & (kBN - 1)) == 0;
  const int64_t k_step = int64_t(Copy::kRowsPerStep) * p.k_row_stride;
  const int64_t v_step = int64_t(Copy::kRowsPerStep) * p.v_row_stride;
  auto load_block = [&](int blk, int stage) {
    const uint32_t dk = sKV + stage * T::kStageBytes, dv = dk + TileKV::kBytes;
    int64_t koff[Copy::kRowIters], voff[Copy::kRowIters];
    if (fast && (!paged || one_page)) {
      int64_t kb, vb;  // row row0's offsets
      const int64_t lr0 = seq.k_row0 + int64_t(blk) * kBN + row0;
      if (paged) {
        const int page = min(max(tab[(blk % kStages) * kGroups], 0), p.num_pages - 1);
        const int64_t in_page = lr0 & ((int64_t(1) << a.page_shift) - 1);
        kb = int64_t(page) * p.k_batch_stride + in_page * p.k_row_stride;
        vb = int64_t(page) * p.v_batch_stride + in_page * p.v_row_stride;
      } else {
        kb = seq.k_batch * p.k_batch_stride + lr0 * p.k_row_stride;
        vb = seq.k_batch * p.v_batch_stride + lr0 * p.v_row_stride;
      }
#pragma unroll
      for (int i = 0; i < Copy::kRowIters; ++i) koff[i] = kb + i * k_step, voff[i] = vb + i * v_step;
    } else {
      row_offsets(blk, koff, voff);
    }
    if (fast) {
      auto copies = [&](auto whole) {  // whole: every row of the block a key, no row test
#pragma unroll
        for (int i = 0; i < Copy::kRowIters; ++i) {
          const int row = row0 + i * Copy::kRowsPerStep;
          const bool ok = decltype(whole)::value || blk * kBN + row < seq.seqlen_k;
#pragma unroll
          for (int c = 0; c < Copy::kColIters; ++c) {
            const int chunk = chunk0 + c * Copy::kThreadsPerRow;
            const uint32_t o = TileKV::offset(row, chunk);
            const Element* ks = k_head + koff[i] + chunk * 8;
            const Element* vs = v_head + voff[i] + chunk * 8;
            constexpr int kPf = FLASHATTN_DECODE_L2_PF;
            cp_async_16_pf<kPf>(dk + o, ok ? static_cast<const void*>(ks) : p.k_ptr, ok);
            cp_async_16_pf<kPf>(dv + o, ok ? static_cast<const void*>(vs) : p.k_ptr, ok);
          }
        }
      };
      if ((blk + 1) * kBN <= seq.seqlen_k) copies(std::true_type{});  // all blocks but the last
      else copies(std::false_type{});
      if (paged) copy_table(blk + kStages - 1);
      return;
    }
#pragma unroll
    for (int i = 0; i < Copy::kRowIters; ++i) {
      const int row = row0 + i * Copy::kRowsPerStep;
      const int j = blk * kBN + row;
      const bool ok = j < seq.seqlen_k;
      const Element* ks = k_head + koff[i];
      const Element* vs = v_head + voff[i];
#pragma unroll
      for (int c = 0; c < Copy::kColIters; ++c) {
        const int chunk = chunk0 + c * Copy::kThreadsPerRow, col = chunk * 8;
        const uint32_t o = TileKV::offset(row, chunk);
        auto copy = [&](uint32_t d, const Element* s, int cols) {
          if (a.vec_ok && col + 8 <= cols) {
            cp_async_16_pf<FLASHATTN_DECODE_L2_PF>(d, ok ? static_cast<const void*>(s) : p.k_ptr,
                                                   ok);
          } else if (col >= cols) {
            cp_async_16(d, p.k_ptr, false);
          } else {
            copy_chunk_elementwise(d, s, ok, col, cols);
          }
        };
        copy(dk + o, ks + col, p.headdim);
        copy(dv + o, vs + col, p.headdim_v);
      }
    }
    if (paged) copy_table(blk + kStages - 1);  // into the slot block blk - 1 was read from
  };

  // Prologue: the first kStages - 1 blocks' table entries read directly; then Q with block 0,
  // then blocks 1 .. kStages - 2 (empty groups keep the counts). Paged: a barrier after each
  // block, whose table copy overwrites the slot the block before it was issued from.
  if (paged) {
    for (int idx = tid; idx < (kStages - 1) * kGroups; idx += T::kThreads) {
      const int blk = blk_begin + idx / kGroups, grp = idx % kGroups;
      tab[(blk % kStages) * kGroups + grp] = has_table ? __ldg(table + table_slot(blk, grp)) : 0;
    }
    __syncthreads();
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_iters) load_block(blk_begin + s, s);
    cp_async_commit();
    if (paged) __syncthreads();
  }

  float acc_o[kNFragsO][4];
#pragma unroll
  for (int ni = 0; ni < kNFragsO; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[ni][e] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const float scale_log2 = a.score_mod ? 1.4426950408889634f : p.softmax_scale_log2;

  // This thread's two rows: token, visible key range, ALiBi slope.
  int tok[2], vis_lo[2], vis_hi[2];
  float slope[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + wm * 16 + g + 8 * half;
    tok[half] = r / a.group;
    vis_lo[half] = mask.key_begin(tok[half]);
    vis_hi[half] = r < rows ? mask.key_end(tok[half]) : 0;
    slope[half] = alibi_slope(p, b, hk * a.group + r % a.group);
  }
  const bool has_cap = p.softcap > 0.f;
  const float inv_cap = has_cap ? 1.f / p.softcap : 0.f;

  // ldmatrix lane coordinates, as in fwd_kernel_sm80.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_hi = lane >> 4;
  const int b_row = (lane & 7) + (lane >> 4) * 8, b_hi = (lane >> 3) & 1;
  const uint32_t q_lane = sQ + (wm * 16 + a_row) * TileQ::kRowBytes;
  const int q_xor = a_hi ^ TileQ::swizzle(a_row);
  const uint32_t k_lane = (wn * kNW + b_row) * TileKV::kRowBytes;
  const int k_xor = b_hi ^ TileKV::swizzle(b_row);
  const uint32_t v_lane = (wn * kNW + a_row) * TileKV::kRowBytes;
  const int v_xor = a_hi ^ TileKV::swizzle(a_row);
  auto q_off = [&](int c) {
    return q_lane + (c / TileQ::kPanelChunks) * TileQ::kPanelBytes +
           (((c % TileQ::kPanelChunks) ^ q_xor) << 4);
  };
  auto kv_off = [&](uint32_t lane_base, int x, int r, int c) {
    return lane_base + (c / TileKV::kPanelChunks) * TileKV::kPanelBytes + r * TileKV::kRowBytes +
           (((c % TileKV::kPanelChunks) ^ x) << 4);
  };

  for (int it = 0; it < n_iters; ++it) {
    const int stage = it % kStages;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // block it has landed; every warp is done with block it - 1's stage
    if (it + kStages - 1 < n_iters) load_block(blk_begin + it + kStages - 1, (it + kStages - 1) % kStages);
    cp_async_commit();
    const uint32_t sK = sKV + stage * T::kStageBytes, sV = sK + TileKV::kBytes;
    const int n0 = (blk_begin + it) * kBN + wn * kNW;  // this warp's first key

    float acc_s[kNFragsS][4];
#pragma unroll
    for (int ni = 0; ni < kNFragsS; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[ni][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < T::kKStepsQK; ++ks) {
      uint32_t qa[4];
      ldmatrix_x4(qa, q_off(2 * ks));
#pragma unroll
      for (int np = 0; np < kNFragsS / 2; ++np) {
        uint32_t bb[4];
        ldmatrix_x4(bb, sK + kv_off(k_lane, k_xor, np * 16, 2 * ks));
        const uint32_t b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
        mma_16816<Element>(acc_s[2 * np], qa, b0);
        mma_16816<Element>(acc_s[2 * np + 1], qa, b1);
      }
    }

    // Score transform, visibility, online softmax (log2 units; a row with no visible key so
    // far keeps max -inf and contributes nothing).
    uint32_t pa[T::kKStepsPV][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = row_max[half];
#pragma unroll
      for (int ni = 0; ni < kNFragsS; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = n0 + ni * 8 + 2 * t4 + e;
          float s = acc_s[ni][2 * half + e];
          if (a.score_mod)
            s = score_mod(s * p.softmax_scale, has_cap, p.softcap, inv_cap, slope[half],
                          tok[half] + shift - j);
          if (j < vis_lo[half] || j >= vis_hi[half]) s = -INFINITY;
          acc_s[ni][2 * half + e] = s;
          mx = fmaxf(mx, s);
        }
      mx = quad_max(mx);
      const float m_scaled = mx == -INFINITY ? 0.f : mx * scale_log2;
      const float corr = fast_exp2(row_max[half] * scale_log2 - m_scaled);
      row_max[half] = mx;
      float sum = 0.f;
#pragma unroll
      for (int ni = 0; ni < kNFragsS; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = fast_exp2(acc_s[ni][2 * half + e] * scale_log2 - m_scaled);
          acc_s[ni][2 * half + e] = pe;
          sum += pe;
        }
      row_sum[half] = row_sum[half] * corr + sum;
#pragma unroll
      for (int ni = 0; ni < kNFragsO; ++ni) {
        acc_o[ni][2 * half] *= corr;
        acc_o[ni][2 * half + 1] *= corr;
      }
    }
#pragma unroll
    for (int kk = 0; kk < T::kKStepsPV; ++kk) {
      pa[kk][0] = pack2<Element>(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      pa[kk][1] = pack2<Element>(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      pa[kk][2] = pack2<Element>(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      pa[kk][3] = pack2<Element>(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
    }
#pragma unroll
    for (int kk = 0; kk < T::kKStepsPV; ++kk)
#pragma unroll
      for (int dp = 0; dp < kNFragsO / 2; ++dp) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, sV + kv_off(v_lane, v_xor, kk * 16, 2 * dp));
        const uint32_t b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
        mma_16816<Element>(acc_o[2 * dp], pa[kk], b0);
        mma_16816<Element>(acc_o[2 * dp + 1], pa[kk], b1);
      }
  }
  cp_async_wait<0>();
  __syncthreads();  // Q and the ring are free: they become the merge scratch

  // Each warp's partial state -> scratch: O (unnormalised), log2-max, sum per row.
  float* so = reinterpret_cast<float*>(smem);
  float* sml = so + T::kWarpsN * kM * kD;  // (warp column, row) -> {m_log2, sum}
  float* srow = sml + T::kWarpsN * kM * 2;  // row -> {M_log2, 1 / L}
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int rr = wm * 16 + g + 8 * half;
    float* dst = so + (wn * kM + rr) * kD;
#pragma unroll
    for (int ni = 0; ni < kNFragsO; ++ni) {
      dst[ni * 8 + 2 * t4] = acc_o[ni][2 * half];
      dst[ni * 8 + 2 * t4 + 1] = acc_o[ni][2 * half + 1];
    }
    const float sum = quad_sum(row_sum[half]);
    if (t4 == 0) {
      sml[(wn * kM + rr) * 2] = row_max[half] == -INFINITY ? -INFINITY : row_max[half] * scale_log2;
      sml[(wn * kM + rr) * 2 + 1] = sum;
    }
  }
  __syncthreads();
  if (tid < kM) {
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) m = fmaxf(m, sml[(w * kM + tid) * 2]);
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) {
      const float mw = sml[(w * kM + tid) * 2];
      if (mw != -INFINITY) l += sml[(w * kM + tid) * 2 + 1] * exp2f(mw - m);
    }
    // lse (natural log) of the row over this split's keys; -inf when it saw none. Without
    // splits the sink (params.h) joins here: its e^sink in the sum, against max(m, sink).
    const int r = r0 + tid;
    float inv = l > 0.f ? 1.f / l : 0.f;
    float lse2 = l > 0.f ? m + log2f(l) : -INFINITY;
    if (num_splits == 1 && p.sink_ptr != nullptr && r < rows) {
      const float sink2 = p.sink_ptr[hk * a.group + r % a.group] * 1.4426950408889634f;
      const float big = fmaxf(m, sink2);
      const float w = l > 0.f ? exp2f(m - big) : 0.f;
      const float total = l * w + (sink2 == -INFINITY ? 0.f : exp2f(sink2 - big));
      inv = total > 0.f ? w / total : 0.f;
      lse2 = total > 0.f ? big + log2f(total) : -INFINITY;
    }
    srow[2 * tid] = m;
    srow[2 * tid + 1] = inv;
    if (r < rows) {
      const int tk = r / a.group, h = hk * a.group + r % a.group;
      const float lse = lse2 * 0.6931471805599453f;
      if (num_splits == 1) {
        p.lse_ptr[b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0 + tk] = lse;
      } else {
        const int64_t q_row = p.is_varlen ? seq.q_row0 + tk : int64_t(b) * p.seqlen_q + tk;
        p.workspace_f32[a.rows_total * a.dv_pitch * num_splits + split * a.rows_total +
                        decode_row_id(p, h, q_row)] = lse;
      }
    }
  }
  __syncthreads();

  // Merged, normalised rows -> out (num_splits 1) or this split's partial output (fp32).
  const int dv = p.headdim_v;
  for (int idx = tid; idx < kM * (kD / 4); idx += T::kThreads) {
    const int rr = idx / (kD / 4), col = (idx % (kD / 4)) * 4;
    const int r = r0 + rr;
    if (r >= rows || col >= dv) continue;
    const float m = srow[2 * rr], inv = srow[2 * rr + 1];
    float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) {
      const float mw = sml[(w * kM + rr) * 2];
      const float f = mw == -INFINITY ? 0.f : exp2f(mw - m) * inv;
      const float* src = so + (w * kM + rr) * kD + col;
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] += f * src[e];
    }
    const int tk = r / a.group, h = hk * a.group + r % a.group;
    if (num_splits == 1) {
      Element* dst = static_cast<Element*>(p.o_ptr) + b * p.o_batch_stride +
                     (seq.q_row0 + tk) * p.o_row_stride + h * p.o_head_stride + col;
      if (a.vec_ok && col + 4 <= dv) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<Element>(o[0], o[1]),
                                                    pack2<Element>(o[2], o[3]));
      } else {
        for (int e = 0; e < 4 && col + e < dv; ++e) {
          const uint32_t w = pack2<Element>(o[e], 0.f);
          reinterpret_cast<uint16_t*>(dst)[e] = static_cast<uint16_t>(w & 0xffffu);
        }
      }
    } else {
      const int64_t q_row = p.is_varlen ? seq.q_row0 + tk : int64_t(b) * p.seqlen_q + tk;
      float* dst = p.workspace_f32 +
                   (split * a.rows_total + decode_row_id(p, h, q_row)) * a.dv_pitch + col;
      *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
    }
  }
}

// Columns col .. col + 3 (those under dv) of an output row, in Element.
template <typename Element>
__device__ __forceinline__ void decode_store_out4(Element* out, int col, int dv, bool vec_ok,
                                                  const float (&o)[4]) {
  if (vec_ok && col + 4 <= dv) {
    *reinterpret_cast<uint2*>(out + col) =
        make_uint2(pack2<Element>(o[0], o[1]), pack2<Element>(o[2], o[3]));
  } else {
    for (int e = 0; e < 4 && col + e < dv; ++e)
      reinterpret_cast<uint16_t*>(out + col)[e] =
          static_cast<uint16_t>(pack2<Element>(o[e], 0.f) & 0xffffu);
  }
}

// The sink (params.h) of head h as one more part of output 0: its e^sink joins the sum l (in
// units of e^m; m moves to the larger of the two). Returns the factor the parts summed so far
// take: 1 without a sink, 0 while m was -inf.
__device__ __forceinline__ float combine_join_sink(const FwdParams& p, int h, float& m, float& l) {
  if (p.sink_ptr == nullptr) return 1.f;
  const float sink = p.sink_ptr[h];
  if (sink == -INFINITY) return 1.f;
  const float big = fmaxf(m, sink);
  const float r = m == -INFINITY ? 0.f : expf(m - big);
  l = l * r + expf(sink - big);
  m = big;
  return r;
}

// Row `row`'s output (head h), and its LSE written from (m, l) where write_lse (one thread).
template <typename Element>
__device__ __forceinline__ Element* combine_row_out(const FwdParams& p, int64_t row, int h,
                                                    float m, float l, bool write_lse) {
  const int64_t q_row = row % p.total_q;
  const int64_t b = p.is_varlen ? 0 : q_row / p.seqlen_q;
  const int64_t tk = p.is_varlen ? q_row : q_row % p.seqlen_q;
  if (write_lse)
    p.lse_ptr[b * p.lse_batch_stride + h * p.lse_head_stride + tk] =
        l > 0.f ? m + logf(l) : -INFINITY;
  return static_cast<Element*>(p.o_ptr) + b * p.o_batch_stride + tk * p.o_row_stride +
         h * p.o_head_stride;
}

// Merges the num_splits partial outputs of every row: weights exp(lse_s - max), out = sum_s
// w_s O_s / sum_s w_s, lse = max + log(sum_s w_s) (the sink's e^sink in the sum when there is
// one). Rows of no sequence (varlen padding) read the zeroed workspace and write zeros there.
// An empty split's weight is 0 (its partial row the split kernel wrote as zeros). Two forms
// (launch_decode_sm80.cuh): decode_combine_cta_kernel below, the default, and this one, the
// serial loop of one warp per row (FLASHATTN_DECODE_COMBINE=serial), which waits on two
// dependent loads a split. (Measured on an H100, 2026-12-07, batch 1 x 4k keys, 33 splits,
// GQA 32/8, d 128: serial 10.8 us, a warp-per-row loop with 8 splits' loads at a time 6.0,
// one with batches of 16 splits prefetched 6.7, the cta form 3.5.) Device code only.
template <typename Element>
__global__ void __launch_bounds__(128)
    decode_combine_kernel(const __grid_constant__ FwdParams p, const DecodeArgs a, int num_splits) {
  if (a.pdl) decode_wait_prerequisites();  // the split kernel's partials
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (row >= a.rows_total) return;
  const float* lse_part = p.workspace_f32 + a.rows_total * a.dv_pitch * num_splits;
  const int dv = p.headdim_v;
  float m = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) m = fmaxf(m, lse_part[s * a.rows_total + row]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float l = 0.f;
  for (int s = lane; s < num_splits; s += 32) {
    const float x = lse_part[s * a.rows_total + row];
    if (x != -INFINITY) l += expf(x - m);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  const int h = static_cast<int>(row / p.total_q);
  combine_join_sink(p, h, m, l);  // no part is summed yet: its factor is not needed
  Element* out = combine_row_out<Element>(p, row, h, m, l, lane == 0);
  const float inv = l > 0.f ? 1.f / l : 0.f;
  for (int col = lane * 4; col < dv; col += 128) {
    float o[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < num_splits; ++s) {
      const float x = lse_part[s * a.rows_total + row];
      if (x == -INFINITY) continue;
      const float w = expf(x - m) * inv;
      const float4 v = *reinterpret_cast<const float4*>(
          p.workspace_f32 + (s * a.rows_total + row) * a.dv_pitch + col);
      o[0] += w * v.x, o[1] += w * v.y, o[2] += w * v.z, o[3] += w * v.w;
    }
    decode_store_out4<Element>(out, col, dv, a.vec_ok, o);
  }
}

// The combine with one CTA per row (the default; launch_decode_sm80.cuh): kCols threads cover
// the row's columns four at a time (16 / 32 / 64 for value dims up to 64 / 128 / 256) and the
// CTA's 256 / kCols slots of them take the splits in turn (slot t: splits t, t + kSlots, ...),
// each thread loading up to kBatch splits' LSEs and partial columns at once, so that a row of
// up to kSlots * kBatch splits (64 at d 128) costs one round trip to L2 where a warp per row
// waits on several; each slot keeps its own running max, sum and weighted columns (online,
// rescaled per batch), and the slots are merged through shared memory. Same results as the
// serial loop above up to the order of the sums: empty splits (LSE -inf) weigh 0, a split
// index past the count reads the last split's row with weight 0, the sink joins the sum.
// Device code only.
__device__ __forceinline__ float4 combine_load4(const float* ptr) {
  float4 v;
  asm volatile("ld.volatile.global.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(ptr));
  return v;
}
__device__ __forceinline__ float combine_load1(const float* ptr) {
  float x;
  asm volatile("ld.volatile.global.f32 %0, [%1];" : "=f"(x) : "l"(ptr));
  return x;
}

template <typename Element, int kCols>
__global__ void __launch_bounds__(256)
    decode_combine_cta_kernel(const __grid_constant__ FwdParams p, const DecodeArgs a,
                              int num_splits) {
  constexpr int kSlots = 256 / kCols, kBatch = 8;
  __shared__ float sm_m[kSlots], sm_l[kSlots];
  __shared__ float4 sm_o[kSlots][kCols];
  if (a.pdl) decode_wait_prerequisites();  // the split kernel's partials
  const int64_t row = blockIdx.x;  // the grid is rows_total CTAs
  const int c = threadIdx.x % kCols, slot = threadIdx.x / kCols;
  const int dv = p.headdim_v, col = c * 4;
  const float* lse_part = p.workspace_f32 + a.rows_total * a.dv_pitch * num_splits;
  const int64_t stride = a.rows_total * a.dv_pitch;  // one split on
  // A thread past the value dim reads column 0 and stores nothing.
  const float* part = p.workspace_f32 + row * a.dv_pitch + (col < dv ? col : 0);
  float m = -INFINITY, l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
  for (int s0 = slot; s0 < num_splits; s0 += kSlots * kBatch) {
    float x[kBatch];
    float4 v[kBatch];
    // Every load of the batch before any use: volatile loads keep their order (ptxas sank
    // plain ones behind the first exponentials, a second round trip).
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int si = s0 + u * kSlots < num_splits ? s0 + u * kSlots : num_splits - 1;
      v[u] = combine_load4(part + si * stride);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int si = s0 + u * kSlots < num_splits ? s0 + u * kSlots : num_splits - 1;
      x[u] = combine_load1(lse_part + int64_t(si) * a.rows_total + row);
    }
    float mb = m;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (s0 + u * kSlots >= num_splits) x[u] = -INFINITY;
      mb = fmaxf(mb, x[u]);
    }
    // No branch on the LSEs (it would hold the partial rows' loads back behind them): a
    // reference of 0 while every split so far is empty, whose weights are all 0.
    const float ref = mb == -INFINITY ? 0.f : mb;
    const float r = expf(m - ref);  // 0 while m is -inf
    l *= r, o[0] *= r, o[1] *= r, o[2] *= r, o[3] *= r;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {  // selects, not branches (w = 0 adds nothing)
      const float w = x[u] == -INFINITY ? 0.f : expf(x[u] - ref);
      l += w;
      o[0] += w != 0.f ? w * v[u].x : 0.f, o[1] += w != 0.f ? w * v[u].y : 0.f;
      o[2] += w != 0.f ? w * v[u].z : 0.f, o[3] += w != 0.f ? w * v[u].w : 0.f;
    }
    m = mb;
  }
  if (c == 0) sm_m[slot] = m, sm_l[slot] = l;
  sm_o[slot][c] = make_float4(o[0], o[1], o[2], o[3]);
  __syncthreads();
  if (slot != 0) return;
  float mx = -INFINITY;
#pragma unroll
  for (int t = 0; t < kSlots; ++t) mx = fmaxf(mx, sm_m[t]);
  float sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (mx != -INFINITY) {
#pragma unroll
    for (int t = 0; t < kSlots; ++t) {
      const float w = sm_m[t] == -INFINITY ? 0.f : expf(sm_m[t] - mx);
      const float4 ot = sm_o[t][c];
      sum += w * sm_l[t];
      acc[0] += w * ot.x, acc[1] += w * ot.y, acc[2] += w * ot.z, acc[3] += w * ot.w;
    }
  }
  const int h = static_cast<int>(row / p.total_q);
  const float r = combine_join_sink(p, h, mx, sum);
  Element* out = combine_row_out<Element>(p, row, h, mx, sum, c == 0);
  const float scale = sum > 0.f ? r / sum : 0.f;
  acc[0] *= scale, acc[1] *= scale, acc[2] *= scale, acc[3] *= scale;
  if (col < dv) decode_store_out4<Element>(out, col, dv, a.vec_ok, acc);
}

}  // namespace flashattn::sm80
