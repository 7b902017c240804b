// The op schemas: the single source of truth for torch.ops.flashattn.*.
// flashattn/ops.py registers fake kernels and autograd against these names.
#pragma once

namespace flashattn::api {

// `deterministic` in the forwards is unused by the kernels: autograd saves it for the
// backward, so it travels inside the op graph (torch.compile-safe).
// Padded layout: q (B, Sq, H, d), k (B, Sk, Hk, d), v (B, Sk, Hk, dv).
// Returns out (B, Sq, H, dv) in q's dtype and softmax_lse (B, H, Sq) fp32.
inline constexpr const char* kFwdSchema =
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left, "
    "int window_right, float softcap, Tensor? alibi_slopes, bool deterministic=False) "
    "-> (Tensor out, Tensor softmax_lse)";

// Returns dq, dk, dv with the shapes and dtype of q, k, v (fresh contiguous tensors).
inline constexpr const char* kBwdSchema =
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
    "float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "Tensor? alibi_slopes, bool deterministic) -> (Tensor dq, Tensor dk, Tensor dv)";

// Varlen layout: q (total_q, H, d), k (total_k, Hk, d), v (total_k, Hk, dv),
// cu_seqlens_q/k int32 (B + 1). Returns out (total_q, H, dv), softmax_lse (H, total_q) fp32.
inline constexpr const char* kVarlenFwdSchema =
    "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "SymInt max_seqlen_q, SymInt max_seqlen_k, float softmax_scale, bool causal, "
    "int window_left, int window_right, float softcap, Tensor? alibi_slopes, "
    "bool deterministic=False) -> (Tensor out, Tensor softmax_lse)";

inline constexpr const char* kVarlenBwdSchema =
    "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
    "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
    "float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "Tensor? alibi_slopes, bool deterministic) -> (Tensor dq, Tensor dk, Tensor dv)";

// Which backend ("cpu", "sm80", "sm80-ptx", "sm90") the fwd / bwd direction of a call with
// these inputs would run; varlen when cu_seqlens_q/k are given. Raises what the call would.
inline constexpr const char* kKernelPathSchema =
    "kernel_path(str direction, Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, "
    "Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
    "bool causal, int window_left, int window_right, float softcap, Tensor? alibi_slopes) "
    "-> str";

}  // namespace flashattn::api
