// The contract between the API layer (csrc/api/) and every backend (cpu, sm80, sm90).
// Torch-free and CUDA-free: plain pointers, int64 strides in elements, runtime flags.
// Filled by exactly one host function per direction (csrc/api/params_fill.h).
#pragma once
#include <cstdint>

namespace flashattn {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

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
//   passes a window side >= seqlen_k (max_seqlen_k for varlen) as -1, as flash-attn does.
// A row with no visible key gives out = 0 and lse = -inf.
struct FwdParams {
  // Inputs. q/k have head dim `headdim`; v and out have head dim `headdim_v`.
  const void* q_ptr = nullptr;
  const void* k_ptr = nullptr;
  const void* v_ptr = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;

  // Outputs: out has q's dtype; lse is fp32.
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

  // Options.
  DType dtype = DType::kFloat16;
  float softmax_scale = 1.f;
  float softmax_scale_log2 = 1.f;  // softmax_scale * log2(e), for exp2
  float softcap = 0.f;             // 0 = off
  int32_t window_left = -1, window_right = -1;  // -1 = unbounded
  const float* alibi_slopes = nullptr;  // fp32, slope of (b, h) at b * alibi_batch_stride + h
  int64_t alibi_batch_stride = 0;       // 0 when slopes are (nheads,)

};

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

  // Backend-owned workspace, allocated zeroed through torch by the API layer with the
  // element counts the backend's bwd_workspace() asked for. Layout is the backend's.
  float* workspace_f32 = nullptr;
  int64_t workspace_f32_elems = 0;
  int32_t* workspace_i32 = nullptr;
  int64_t workspace_i32_elems = 0;

  bool deterministic = false;
};

struct BwdWorkspaceSizes {
  int64_t f32_elems = 0;
  int64_t i32_elems = 0;
};

}  // namespace flashattn
