// The op schemas: the single source of truth for torch.ops.flashattn.*.
// flashattn/ops.py registers fake kernels and autograd against these names.
#pragma once

namespace flashattn::api {

// `deterministic` in the forwards is unused by the kernels: autograd saves it for the
// backward, so it travels inside the op graph (torch.compile-safe).
// Dropout and sinks (params.h, issue 15), the same three arguments in the four attention ops:
// dropout_p in [0, 1) (0 = off); rng_state int64 (2,) = {seed, offset} on q's device, needed
// when dropout_p > 0 (flashattn's functions draw it with torch.randint; autograd saves it, so
// the backward regenerates the forward's mask); learnable_sink fp32 (nheads,) or None. The
// backwards return dsink fp32 (nheads,) as a fourth output (an empty (0,) tensor without a
// sink).
// Block-sparse attention (params.h, issue 16), the same six arguments in the four attention
// ops (varlen: the blocks of each sequence, Sq / Sk = max_seqlen_q / k; no block_table):
// kv_num_blocks int32 (B or 1, H or 1, nq), kv_indices int32 (B or 1, H or 1, nq,
// nk) with nq = ceil(Sq / block_size_m), nk = ceil(Sk / block_size_n); q_num_blocks (.., nk)
// and q_indices (.., nk, nq) their transposed view, which only the backward reads (the forward
// takes it so that autograd hands it on; block_sparse_attn_func builds both on the device).
// Block sizes: multiples of 16 in [16, 256]. All None = dense.
// FP8 (params.h, issue 14), the same four arguments in fwd and varlen_fwd: q, k, v of dtype
// float8_e4m3fn with q_descale / k_descale / v_descale fp32 (B, Hk) on q's device, last
// dimension contiguous, or None (= 1; flashattn's functions broadcast what the user passes to
// (B, Hk) and make it contiguous), and out_dtype bfloat16 (None) or float16. Forward only (the
// backwards refuse float8 inputs); no ALiBi, dropout, sink, block mask or block_table with it.
// Descales with 16/32-bit inputs are an error (never silently dropped), as is an out_dtype
// other than q's dtype.
// Position offsets (params.h, issue 17), the same two arguments in the four attention ops:
// q_pos_offset / k_pos_offset int32 (B,) on q's device (varlen: one per sequence) or None (=
// 0): sequence b's query row i and key j stand at positions i + q_pos_offset[b] and j +
// k_pos_offset[b] for the mask, ALiBi and the dropout mask (ring attention: a chunk pair of a
// longer sequence). Tensors rather than ints: the varlen ring's chunks of each sequence start
// at a different position. Not built on CUDA yet (a named error there).
// Padded layout: q (B, Sq, H, d), k (B, Sk, Hk, d), v (B, Sk, Hk, dv).
// Returns out (B, Sq, H, dv) in q's dtype (out_dtype for FP8) and softmax_lse (B, H, Sq) fp32.
inline constexpr const char* kFwdSchema =
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left, "
    "int window_right, float softcap, Tensor? alibi_slopes, bool deterministic=False, "
    "float dropout_p=0.0, Tensor? rng_state=None, Tensor? learnable_sink=None, "
    "Tensor? kv_num_blocks=None, Tensor? kv_indices=None, Tensor? q_num_blocks=None, "
    "Tensor? q_indices=None, int block_size_m=128, int block_size_n=128, "
    "Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, "
    "ScalarType? out_dtype=None, Tensor? q_pos_offset=None, Tensor? k_pos_offset=None) "
    "-> (Tensor out, Tensor softmax_lse)";

// Returns dq, dk, dv with the shapes and dtype of q, k, v (fresh contiguous tensors), dsink.
inline constexpr const char* kBwdSchema =
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
    "float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "Tensor? alibi_slopes, bool deterministic, float dropout_p=0.0, Tensor? rng_state=None, "
    "Tensor? learnable_sink=None, Tensor? kv_num_blocks=None, Tensor? kv_indices=None, "
    "Tensor? q_num_blocks=None, Tensor? q_indices=None, int block_size_m=128, "
    "int block_size_n=128, Tensor? q_pos_offset=None, Tensor? k_pos_offset=None) "
    "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsink)";

// Varlen layout: q (total_q, H, d), k (total_k, Hk, d), v (total_k, Hk, dv),
// cu_seqlens_q/k int32 (B + 1). Returns out (total_q, H, dv), softmax_lse (H, total_q) fp32.
// With block_table int32 (B, max_pages) (paged KV): k (num_pages, page_size, Hk, d), v
// (num_pages, page_size, Hk, dv), sequence b's cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys
// from its first page on; forward only (the autograd backward raises).
inline constexpr const char* kVarlenFwdSchema =
    "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "SymInt max_seqlen_q, SymInt max_seqlen_k, float softmax_scale, bool causal, "
    "int window_left, int window_right, float softcap, Tensor? alibi_slopes, "
    "bool deterministic=False, Tensor? block_table=None, float dropout_p=0.0, "
    "Tensor? rng_state=None, Tensor? learnable_sink=None, Tensor? kv_num_blocks=None, "
    "Tensor? kv_indices=None, Tensor? q_num_blocks=None, Tensor? q_indices=None, "
    "int block_size_m=128, int block_size_n=128, Tensor? q_descale=None, "
    "Tensor? k_descale=None, Tensor? v_descale=None, ScalarType? out_dtype=None, "
    "Tensor? q_pos_offset=None, Tensor? k_pos_offset=None) -> (Tensor out, Tensor softmax_lse)";

inline constexpr const char* kVarlenBwdSchema =
    "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
    "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
    "float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "Tensor? alibi_slopes, bool deterministic, float dropout_p=0.0, Tensor? rng_state=None, "
    "Tensor? learnable_sink=None, Tensor? kv_num_blocks=None, Tensor? kv_indices=None, "
    "Tensor? q_num_blocks=None, Tensor? q_indices=None, int block_size_m=128, "
    "int block_size_n=128, Tensor? q_pos_offset=None, Tensor? k_pos_offset=None) "
    "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsink)";

// return_attn_probs: S (params.h) of a forward that returned softmax_lse, from the same inputs:
// (B, H, round128(Sq), round128(Sk)) in q's dtype, varlen (B, H, round128(max_seqlen_q),
// round128(max_seqlen_k)); the probabilities P, negated where dropout drops them, 0 elsewhere.
// A debugging output (O(seqlen^2)), no autograd; CPU only for now.
inline constexpr const char* kAttnProbsSchema =
    "attn_probs(Tensor q, Tensor k, Tensor v, Tensor softmax_lse, Tensor? cu_seqlens_q, "
    "Tensor? cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, float softmax_scale, "
    "bool causal, int window_left, int window_right, float softcap, Tensor? alibi_slopes, "
    "float dropout_p=0.0, Tensor? rng_state=None, Tensor? learnable_sink=None) -> Tensor";

// flash_attn_with_kvcache: appends k / v (B, Sk_new, Hk, d / dv) into the caches in place at
// rows cache_seqlens[b] + i (rotated by rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2),
// as q is for the attention), then attends q (B, Sq, H, d) to the cache rows [cache_leftpad[b],
// cache_seqlens[b] + Sk_new) of batch cache_batch_idx[b]. Caches (B_cache, Sk, Hk, d / dv), or
// paged (num_pages, page_size, Hk, d / dv) with block_table (B, max_pages); every metadata
// tensor int32. num_splits: the CUDA split-KV count, 0 = chosen. Returns out (B, Sq, H, dv),
// softmax_lse (B, H, Sq) fp32; no autograd.
inline constexpr const char* kFwdKvcacheSchema =
    "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, "
    "Tensor? rotary_cos, Tensor? rotary_sin, Tensor? cache_seqlens, Tensor? cache_batch_idx, "
    "Tensor? cache_leftpad, Tensor? block_table, float softmax_scale, bool causal, "
    "int window_left, int window_right, float softcap, bool rotary_interleaved, "
    "Tensor? alibi_slopes, int num_splits) -> (Tensor out, Tensor softmax_lse)";

// Which backend ("cpu", "sm80", "sm80-ptx", "sm80-decode", "sm90") the fwd / bwd direction of a call with
// these inputs would run; varlen when cu_seqlens_q/k are given. Raises what the call would
// (float8 q: the FP8 errors; the bwd direction of float8 inputs: FP8 is forward only). The
// block-mask arguments as in the attention ops (the bwd direction needs the transposed view).
inline constexpr const char* kKernelPathSchema =
    "kernel_path(str direction, Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, "
    "Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
    "bool causal, int window_left, int window_right, float softcap, Tensor? alibi_slopes, "
    "float dropout_p=0.0, Tensor? learnable_sink=None, Tensor? kv_num_blocks=None, "
    "Tensor? kv_indices=None, Tensor? q_num_blocks=None, Tensor? q_indices=None, "
    "int block_size_m=128, int block_size_n=128) -> str";

}  // namespace flashattn::api
