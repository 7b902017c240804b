// The contract between the API layer (csrc/api/) and every backend (cpu, sm80, sm90).
// Torch-free and CUDA-free: plain pointers, int64 strides in elements, runtime flags.
// Filled by exactly one host function per direction (csrc/api/params_fill.h).
#pragma once
#include <cstdint>

namespace flashattn {

// kFloat8E4M3: torch.float8_e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no
// infinities, NaN = S.1111.111, max 448); q / k / v of an FP8 forward only (issue 14).
enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat8E4M3 = 3 };

// Layouts (strides are in elements, the last dimension is always contiguous):
//   padded : q (batch, seqlen_q, nheads, d)        lse (batch, nheads, seqlen_q) fp32
//   varlen : q (total_q, nheads, d) + cu_seqlens_q  lse (nheads, total_q)        fp32
// In varlen mode every *_batch_stride is 0 and sequence b starts at row cu_seqlens[b].
//
// Score semantics (identical on every backend), for query row i and key column j of
// one sequence with lengths (sq, sk):
//   s = q.k * softmax_scale
//   if softcap > 0:      s = softcap * tanh(s / softcap)
//   if alibi_slopes:     s += -slope * |i + sk - sq - j|
//   visible(i, j) iff    (window_left  < 0 || j >= i + sk - sq - window_left) &&
//                        (window_right < 0 || j <= i + sk - sq + window_right)
//   causal is passed as window_right = 0 (bottom-right aligned, flash-attn >= 2.1); the API
//   passes a window side >= seqlen_k (max_seqlen_k for varlen) as -1, as flash-attn does
//   (not with position offsets, below: it passes their window as given).
// A row with no visible key gives out = 0 and lse = -inf.
//
// Position offsets (q_pos_offset / k_pos_offset != nullptr, issue 17: ring attention computes
// blocks of a longer sequence's score matrix): int32 (batch,) on q's device, nullptr = 0.
// Sequence b's query row i and key column j stand at positions
//   i' = i + q_pos_offset[b],   j' = j + k_pos_offset[b]
// and every position-dependent term above and below reads (i', j') in place of (i, j), with
// the call's own diagonal shift sk - sq: visible(i, j) iff (window_left < 0 || j' >= i' + sk -
// sq - window_left) && (window_right < 0 || j' <= i' + sk - sq + window_right) (causal too);
// ALiBi's distance is |i' + sk - sq - j'|; dropout's Z is that of (i', j'). What stays local:
// which rows and keys exist (i in [0, sq), j in [0, sk), the sequence's own rows of q / k),
// block-sparse tiles (of the local (i, j)), and attn_probs' S (indexed by the local (i, j)).
// So a square call (sq = sk) with offsets (a, c) is rows [a, a + sq) x columns [c, c + sk)
// of a self-attention (shift 0) over the long sequence. Untrusted (no host sync): backends
// clamp each offset to [0, kMaxPosOffset]. CUDA: the main kernels take them in the mask,
// ALiBi and the deterministic backwards' orders (MaskInfo::pos_shift), the sm90 kernels in
// dropout's Z too (dropout_lanes.cuh; with dropout the sm80 kernels raise), with sequences and
// window sides below 2^28 (backend_choice.h).
//
// Attention sink (sink_ptr != nullptr, issue 15; FA4's learnable_sink): sink_h = sink_ptr[h] is
// a logit in the units of the final scores s above (after softmax_scale, softcap and ALiBi;
// natural log, not log2) of a key that every row of head h sees and whose value is 0:
//   P_ij = exp(s_ij - lse_i),  lse_i = log(exp(sink_h) + sum_{visible j} exp(s_ij))
// so the lse includes the sink, out_i = sum_j P_ij v_j has weight 1 - exp(sink_h - lse_i),
// and a row with no visible key gives out = 0 and lse = sink_h (not -inf).
// Dropout (dropout_threshold > 0): out_i = sum_j Z_ij P_ij v_j * dropout_scale, where Z_ij =
// dropout_keep(rng seed, offset, b, h, i', j') (philox.h) is a function of (seed, offset, batch
// b, query head h, row i', column j') only, i' and j' the row and key column within sequence b
// (key 0 = the sequence's first key) plus the position offsets above (0 without them):
// independent of tiling, the same on every backend.
// P (and the lse) are those of the undropped softmax, as in flash-attn; the sink is never
// dropped. p is quantised to 8 bits: dropout_threshold = max(1, round(p * 256)) (at most
// 255), a column is dropped iff its Philox byte < dropout_threshold, so the effective p is
// p_q = threshold / 256; dropout_scale = 1 / (1 - p) of the p asked for, flash-attn's scale
// (its tests recompute the output from the mask that S encodes with that scale), so E[out]
// is the undropped out times (1 - p_q) / (1 - p): within 1 / (512 (1 - p)) of it.
//
// FP8 forward (dtype == kFloat8E4M3, issue 14): q, k, v hold e4m3 codes, and every formula
// above applies to the dequantized inputs, per sequence b and KV head hk = h / (nheads /
// nheads_k) (query head h's group; varlen: b is the sequence index):
//   q_deq[b, i, h, c]  = float(q[b, i, h, c])  * q_descale(b, hk)
//   k_deq[b, j, hk, c] = float(k[b, j, hk, c]) * k_descale(b, hk)
//   v_deq[b, j, hk, c] = float(v[b, j, hk, c]) * v_descale(b, hk)
//   x_descale(b, hk)   = x_descale_ptr ? x_descale_ptr[b * x_descale_batch_stride + hk] : 1
// so s = (q.k)_e4m3 * q_descale * k_descale * softmax_scale (the descales fold into the
// softmax scale) and out = (P v)_e4m3 * v_descale (folded into the epilogue). out is bf16 or
// fp16 (out_dtype), lse fp32. Forward only; the API refuses ALiBi, dropout, sinks,
// block-sparse, paged KV / KV cache and attn_probs with FP8 on every backend, so an FP8
// kernel never sees those fields set. A kernel may round P to e4m3 for its P V product (the
// tolerance is that of tests/reference.py's emulation: P scaled by 2^8 before the rounding,
// the row sum l taken from the unrounded fp32 P); the CPU backend keeps P in fp32.
inline constexpr int32_t kMaxPosOffset = int32_t(1) << 30;

struct FwdParams {
  // Inputs. q/k have head dim `headdim`; v and out have head dim `headdim_v`.
  const void* q_ptr = nullptr;
  const void* k_ptr = nullptr;
  const void* v_ptr = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;

  // Outputs: out has dtype out_dtype (below: q's dtype, bf16 / fp16 for FP8); lse is fp32.
  void* o_ptr = nullptr;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  float* lse_ptr = nullptr;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // row stride is 1

  // Sizes. For varlen, seqlen_q/seqlen_k are max_seqlen_q/k (grid sizing only) and
  // total_q/total_k are the row counts of the tensors (the extents every index is
  // clamped to). For padded, total_q = batch * seqlen_q, total_k = batch * seqlen_k.
  int32_t batch = 0, nheads = 0, nheads_k = 0;
  int32_t headdim = 0, headdim_v = 0;
  int32_t seqlen_q = 0, seqlen_k = 0;
  int64_t total_q = 0, total_k = 0;

  // Varlen metadata (int32, batch + 1 entries each) on the device of q; nullptr = padded.
  // Untrusted: backends clamp every derived row index to [0, total_q/total_k].
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  bool is_varlen = false;

  // Options. dtype: q / k / v's element type; out_dtype: out's, equal to dtype except for
  // FP8 (dtype kFloat8E4M3, out_dtype kBFloat16 or kFloat16).
  DType dtype = DType::kFloat16;
  DType out_dtype = DType::kFloat16;
  float softmax_scale = 1.f;
  float softmax_scale_log2 = 1.f;  // softmax_scale * log2(e), for exp2
  float softcap = 0.f;             // 0 = off
  int32_t window_left = -1, window_right = -1;  // -1 = unbounded
  const float* alibi_slopes = nullptr;  // fp32, slope of (b, h) at b * alibi_batch_stride + h
  int64_t alibi_batch_stride = 0;       // 0 when slopes are (nheads,)

  // Position offsets (semantics above): int32 (batch,) on q's device, contiguous; nullptr = 0.
  const int32_t* q_pos_offset = nullptr;
  const int32_t* k_pos_offset = nullptr;

  // Attention sink (semantics above): fp32 (nheads,) on q's device, nullptr = off.
  const float* sink_ptr = nullptr;

  // FP8 descales (semantics above): fp32 (batch, nheads_k) on q's device, head stride 1, the
  // batch stride nheads_k (the API makes them contiguous); nullptr = 1. Only with dtype
  // kFloat8E4M3 (the API refuses descales of other dtypes).
  const float* q_descale_ptr = nullptr;
  const float* k_descale_ptr = nullptr;
  const float* v_descale_ptr = nullptr;
  int64_t q_descale_batch_stride = 0, k_descale_batch_stride = 0, v_descale_batch_stride = 0;

  // Dropout (semantics above); dropout_threshold == 0 = off (then the rest is unused).
  // rng_state: int64 (2,) = {seed, offset} on q's device, drawn by the caller (interface.py,
  // torch.randint: fresh per call and per CUDA-graph replay); a kernel reads it from memory
  // (never a host copy), so a captured graph replays with the values of each replay.
  float dropout_p = 0.f;              // as passed, for checks and messages
  uint32_t dropout_threshold = 0;     // in [0, 255]: dropout_threshold_u8(dropout_p)
  float dropout_scale = 1.f;          // 1 / (1 - dropout_p) (1 without dropout)
  const int64_t* rng_state = nullptr;

  // attn_probs (return_attn_probs=True): S (batch, nheads, s_rows, s_cols) in q's dtype, rows
  // and columns the sequence-local (i, j) up to max_seqlen_q/k rounded up to 128 (as
  // flash-attn). S = exp(s_ij - m_i), m_i the row's max visible score (no sink): flash-attn's
  // S for a single key block (its tests normalise it by exp(m_i - lse_i) per key block of
  // interface._get_block_size_n), so P_ij = |S_ij| exp(m_i - lse_i); negated where dropout
  // drops it, 0 where (i, j) is not visible or outside the sequence (a block mask does not
  // reach attn_probs: block_sparse_attn_func zeroes the dropped tiles of S, m_i stays the max
  // over every causally visible key). Only the attn_probs op
  // sets s_ptr; the forward kernels ignore it (lse_ptr is not read).
  void* s_ptr = nullptr;
  int64_t s_batch_stride = 0, s_head_stride = 0, s_row_stride = 0;
  int32_t s_rows = 0, s_cols = 0;

  // KV cache (flash_attn_with_kvcache) and paged KV. int32 on q's device, untrusted: seq_info
  // and the kernels clamp them (wrong numbers at worst, never an out-of-bounds access).
  //   seqused_k[b]    sequence b's keys end at row seqused_k[b] + seqlen_knew (seqused_k is
  //                   cache_seqlens, the cache's length before this call's append of
  //                   seqlen_knew rows); nullptr = the sequence's full length
  //   leftpad_k[b]    and start at row leftpad_k[b] (cache_leftpad; nullptr = 0). Key index 0
  //                   of the score semantics above is that row.
  //   kv_batch_idx[b] sequence b reads k / v batch kv_batch_idx[b] (cache_batch_idx, padded
  //                   layout only; nullptr = b), clamped to [0, kv_batch)
  // Paged (block_table != nullptr): k / v are (num_pages, page_size, nheads_k, d), their
  // batch strides the page strides; logical key row r of sequence b is row r % page_size of
  // page block_table[b * block_table_batch_stride + r / page_size] (entries clamped to
  // [0, num_pages), r / page_size to [0, max_pages_per_seq)), and seqlen_k is the capacity
  // max_pages_per_seq * page_size. Varlen + paged: sequence b has cu_seqlens_k[b + 1] -
  // cu_seqlens_k[b] keys from logical row 0.
  const int32_t* seqused_k = nullptr;
  const int32_t* leftpad_k = nullptr;
  const int32_t* kv_batch_idx = nullptr;
  int32_t kv_batch = 0;
  int32_t seqlen_knew = 0;
  const int32_t* block_table = nullptr;
  int64_t block_table_batch_stride = 0;
  int32_t page_size = 0, num_pages = 0, max_pages_per_seq = 0;

  // Split-KV decoding: the number of key splits, 0 = the backend chooses (num_splits).
  int32_t num_splits = 0;

  // Block-sparse attention (issue 16; kv_num_blocks != nullptr = on; no paged KV). The
  // score matrix of each sequence is tiled block_m x block_n: query block qb holds its rows
  // [qb * block_m, + block_m), key block kb its columns [kb * block_n, + block_n), the last of
  // each ending at the sequence's length; n_qblocks = ceil(seqlen_q / block_m), n_kblocks =
  // ceil(seqlen_k / block_n) (varlen: of max_seqlen_q / k; blocks past them keep nothing). Query head h of batch b in query block qb keeps key blocks
  //   kv_indices[c * n_kblocks + t], t < kv_num_blocks[c],
  //   c = b * bs_batch_stride + h * bs_head_stride + qb   (strides 0 where the mask broadcasts)
  // and every other tile is dropped: its (i, j) are not visible. Inside a kept tile causal /
  // window mask as above. Untrusted (int32 on q's device): counts are clamped to [0, n_kblocks],
  // indices to [0, n_kblocks); a repeated index counts twice (wrong numbers, never OOB). A row
  // whose tiles are all dropped sees no key: out 0, lse -inf (sink_h with a sink, as above).
  // Dropout's Z_ij is unchanged (a function of the global (i, j)), dropped tiles have P = 0.
  const int32_t* kv_num_blocks = nullptr;
  const int32_t* kv_indices = nullptr;
  int64_t bs_batch_stride = 0, bs_head_stride = 0;
  int32_t block_m = 0, block_n = 0, n_qblocks = 0, n_kblocks = 0;

  // Backend-owned workspace, allocated zeroed through torch by the API layer with the
  // element counts the backend's *_workspace() asked for. Layout is the backend's.
  float* workspace_f32 = nullptr;
  int64_t workspace_f32_elems = 0;
  int32_t* workspace_i32 = nullptr;
  int64_t workspace_i32_elems = 0;
};

// The append step of flash_attn_with_kvcache, run before its attention (whose FwdParams
// describe the caches: k_ptr / v_ptr, seqused_k = cache_seqlens, leftpad_k, kv_batch_idx,
// paging, seqlen_knew = the rows appended). k_new / v_new (batch, seqlen_knew, nheads_k,
// d / dv) go to cache rows seqused_k[b] + i of sequence b (through the block table when
// paged); a row at or past the capacity (seqlen_k) is dropped, never written.
// Rotary (rotary_dim > 0, even, <= headdim): cos / sin are (seqlen_ro, rotary_dim / 2) in q's
// dtype (row stride rotary_stride); k_new row i is rotated at position seqused_k[b] + i, q row
// i at seqused_k[b] + (q_rot_per_row ? i : 0) (per row when causal or local, as flash-attn),
// positions clamped to [0, seqlen_ro). Interleaved: pairs (2j, 2j + 1); otherwise (j, j +
// rotary_dim / 2). The rotated q is written to q_rot_ptr (q's shape, q_rot strides), which
// the attention then reads as its q; dims past rotary_dim are copied unchanged.
struct KvAppendParams {
  const void* knew_ptr = nullptr;
  const void* vnew_ptr = nullptr;  // both null: no append (rotary of q alone)
  int64_t knew_batch_stride = 0, knew_row_stride = 0, knew_head_stride = 0;
  int64_t vnew_batch_stride = 0, vnew_row_stride = 0, vnew_head_stride = 0;
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t rotary_stride = 0;
  int32_t seqlen_ro = 0, rotary_dim = 0;  // rotary_dim 0 = no rotary
  bool rotary_interleaved = true;
  bool q_rot_per_row = false;
  void* q_rot_ptr = nullptr;
  int64_t q_rot_batch_stride = 0, q_rot_row_stride = 0, q_rot_head_stride = 0;
};

// A dropout call with position offsets (host: the sm80 kernels refuse it, backend_choice.h;
// the sm90 launches add the cell-by-cell mask's kernel, dropout_lanes.cuh).
inline bool dropout_offsets_call(const FwdParams& p) {
  return p.dropout_threshold > 0 && (p.q_pos_offset != nullptr || p.k_pos_offset != nullptr);
}

struct BwdParams : FwdParams {
  // o_ptr / lse_ptr (inherited) are the forward's saved out and softmax_lse (read-only here).
  const void* do_ptr = nullptr;
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;

  // Gradients, in q's dtype, fresh contiguous tensors: dq has q's shape, dk/dv have
  // k/v's shape. For GQA/MQA the backend sums over the query heads of each group itself
  // (through its workspace if it needs one).
  void* dq_ptr = nullptr;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  void* dk_ptr = nullptr;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  void* dv_ptr = nullptr;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  // D = rowsum(dO * O), fp32, laid out like lse (same strides). Written by the backend.
  float* dsoftmax_sum = nullptr;

  // With sink_ptr: the sink's gradient, fp32 (nheads,), zeroed by the API; the backend adds
  // into it dsink_h = -sum over the rows i of every sequence of exp(sink_h - lse_i) * D_i
  // (the sink column's dP is 0, its value being 0; holds with dropout too). How partial sums
  // are combined (atomics, a workspace) is the backend's; the CPU's order is fixed.
  float* dsink_ptr = nullptr;
  // Dropout: the forward's rng_state and threshold (FwdParams) regenerate the same Z:
  //   dV = (Z P scale)^T dO,  dP = Z * (dO V^T) * scale,  dS = P (dP - D),  D = rowsum(dO O).

  // The workspace (FwdParams) holds the backend's bwd_workspace() request.
  bool deterministic = false;

  // Block-sparse backward (q_num_blocks != nullptr = on): the transposed view of the forward's
  // kv_num_blocks / kv_indices (FwdParams, which the backward does not read), built by the API
  // on the device: key block kb of (b, h) is kept by query blocks q_indices[c * n_qblocks + t],
  // t < q_num_blocks[c], c = b * bs_t_batch_stride + h * bs_t_head_stride + kb; clamped as above
  // (counts to [0, n_qblocks], indices to [0, n_qblocks)). Same block_m / block_n.
  const int32_t* q_num_blocks = nullptr;
  const int32_t* q_indices = nullptr;
  int64_t bs_t_batch_stride = 0, bs_t_head_stride = 0;
};

struct WorkspaceSizes {
  int64_t f32_elems = 0;
  int64_t i32_elems = 0;
};
using BwdWorkspaceSizes = WorkspaceSizes;

}  // namespace flashattn
