// The one place that turns tensors + options into FwdParams / BwdParams.
#pragma once
#include <cmath>
#include <optional>

#include "../common/params.h"
#include "checks.h"

namespace flashattn::api {

struct Options {
  double softmax_scale;
  bool causal;
  int64_t window_left, window_right;
  double softcap;
  std::optional<Tensor> alibi_slopes;
  bool deterministic;
};

// Sizes read from validated inputs. Padded: q (B, Sq, H, d). Varlen: q (total_q, H, d).
struct Problem {
  bool varlen = false;
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, nheads = 0, nheads_k = 0;
  int64_t headdim = 0, headdim_v = 0, total_q = 0, total_k = 0;
};

inline DType to_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return DType::kFloat16;
    case ScalarType::BFloat16: return DType::kBFloat16;
    default: return DType::kFloat32;
  }
}

// Strides of a (B, S, H, d) or (total, H, d) tensor as (batch, row, head); batch is 0 in varlen.
struct Strides3 {
  int64_t batch, row, head;
};
inline Strides3 strides_of(const Tensor& t, bool varlen) {
  if (varlen) return {0, t.stride(0), t.stride(1)};
  return {t.stride(0), t.stride(1), t.stride(2)};
}

// out and lse may be null (a backend choice asked before any output exists): then the
// pointers stay null and the strides are those of the fresh contiguous outputs the op makes.
inline void fill_fwd_params(FwdParams& p, const Problem& pb, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor* out, const Tensor* lse,
                            const Options& opt, const Tensor* cu_q, const Tensor* cu_k) {
  const bool vl = pb.varlen;
  p.q_ptr = q.data_ptr();
  p.k_ptr = k.data_ptr();
  p.v_ptr = v.data_ptr();
  p.o_ptr = out ? out->data_ptr() : nullptr;
  p.lse_ptr = lse ? static_cast<float*>(lse->data_ptr()) : nullptr;
  auto sq = strides_of(q, vl), sk = strides_of(k, vl), sv = strides_of(v, vl);
  const int64_t dv = pb.headdim_v;
  auto so = out ? strides_of(*out, vl)
                : Strides3{vl ? 0 : pb.seqlen_q * pb.nheads * dv, pb.nheads * dv, dv};
  p.q_batch_stride = sq.batch, p.q_row_stride = sq.row, p.q_head_stride = sq.head;
  p.k_batch_stride = sk.batch, p.k_row_stride = sk.row, p.k_head_stride = sk.head;
  p.v_batch_stride = sv.batch, p.v_row_stride = sv.row, p.v_head_stride = sv.head;
  p.o_batch_stride = so.batch, p.o_row_stride = so.row, p.o_head_stride = so.head;
  // lse: padded (B, H, Sq); varlen (H, total_q).
  if (lse) {
    p.lse_batch_stride = vl ? 0 : lse->stride(0);
    p.lse_head_stride = vl ? lse->stride(0) : lse->stride(1);
  } else {
    p.lse_batch_stride = vl ? 0 : pb.nheads * pb.seqlen_q;
    p.lse_head_stride = vl ? pb.total_q : pb.seqlen_q;
  }

  p.batch = static_cast<int32_t>(pb.batch);
  p.nheads = static_cast<int32_t>(pb.nheads);
  p.nheads_k = static_cast<int32_t>(pb.nheads_k);
  p.headdim = static_cast<int32_t>(pb.headdim);
  p.headdim_v = static_cast<int32_t>(pb.headdim_v);
  p.seqlen_q = static_cast<int32_t>(pb.seqlen_q);
  p.seqlen_k = static_cast<int32_t>(pb.seqlen_k);
  p.total_q = pb.total_q;
  p.total_k = pb.total_k;
  p.is_varlen = vl;
  p.cu_seqlens_q = cu_q ? static_cast<const int32_t*>(cu_q->data_ptr()) : nullptr;
  p.cu_seqlens_k = cu_k ? static_cast<const int32_t*>(cu_k->data_ptr()) : nullptr;

  p.dtype = to_dtype(q.scalar_type());
  p.softmax_scale = static_cast<float>(opt.softmax_scale);
  p.softmax_scale_log2 = static_cast<float>(opt.softmax_scale * M_LOG2E);
  p.softcap = static_cast<float>(opt.softcap);
  // As flash-attn: a window side at least seqlen_k wide (max_seqlen_k for varlen) is
  // unbounded. This matters when seqlen_q > seqlen_k (the diagonal shifts left).
  int64_t wl = opt.window_left, wr = opt.causal ? 0 : opt.window_right;
  if (wl >= pb.seqlen_k) wl = -1;
  if (!opt.causal && wr >= pb.seqlen_k) wr = -1;
  p.window_left = static_cast<int32_t>(wl);
  p.window_right = static_cast<int32_t>(wr);
  if (opt.alibi_slopes.has_value()) {
    const Tensor& a = *opt.alibi_slopes;
    p.alibi_slopes = static_cast<const float*>(a.data_ptr());
    p.alibi_batch_stride = a.dim() == 2 ? a.stride(0) : 0;
  }
}

inline void fill_bwd_params(BwdParams& p, const Problem& pb, const Tensor& dout, const Tensor& q,
                            const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, const Tensor& dsoftmax_sum, const Options& opt,
                            const Tensor* cu_q, const Tensor* cu_k) {
  fill_fwd_params(p, pb, q, k, v, &out, &lse, opt, cu_q, cu_k);
  const bool vl = pb.varlen;
  p.do_ptr = dout.data_ptr();
  auto sdo = strides_of(dout, vl), sdq = strides_of(dq, vl), sdk = strides_of(dk, vl),
       sdv = strides_of(dv, vl);
  p.do_batch_stride = sdo.batch, p.do_row_stride = sdo.row, p.do_head_stride = sdo.head;
  p.dq_ptr = dq.data_ptr();
  p.dq_batch_stride = sdq.batch, p.dq_row_stride = sdq.row, p.dq_head_stride = sdq.head;
  p.dk_ptr = dk.data_ptr();
  p.dk_batch_stride = sdk.batch, p.dk_row_stride = sdk.row, p.dk_head_stride = sdk.head;
  p.dv_ptr = dv.data_ptr();
  p.dv_batch_stride = sdv.batch, p.dv_row_stride = sdv.row, p.dv_head_stride = sdv.head;
  p.dsoftmax_sum = static_cast<float*>(dsoftmax_sum.data_ptr());
  p.deterministic = opt.deterministic;
}

}  // namespace flashattn::api
