// The one place that turns tensors + options into FwdParams / BwdParams (and the kvcache
// fields of FwdParams plus KvAppendParams).
#pragma once
#include <cmath>
#include <optional>

#include "../common/params.h"
#include "../common/philox.h"
#include "checks.h"

namespace flashattn::api {

struct Options {
  double softmax_scale;
  bool causal;
  int64_t window_left, window_right;
  double softcap;
  std::optional<Tensor> alibi_slopes;
  bool deterministic;
  // Dropout and sinks (params.h); set by with_features (flash_api.cpp).
  double dropout_p = 0.0;
  std::optional<Tensor> rng_state;
  std::optional<Tensor> learnable_sink;
  // Block-sparse (params.h, schema.h); set by op_options (flash_api.cpp), checked by
  // check_block_sparse (input_checks.h).
  std::optional<Tensor> kv_num_blocks, kv_indices, q_num_blocks, q_indices;
  int64_t block_m = 128, block_n = 128;
  // FP8 (params.h, schema.h); set by op_options, checked by check_fp8 (input_checks.h).
  std::optional<Tensor> q_descale, k_descale, v_descale;
  std::optional<ScalarType> out_dtype;
  // Position offsets (params.h, schema.h); set by op_options, checked by check_pos_offsets.
  std::optional<Tensor> q_pos_offset, k_pos_offset;
};

inline bool is_fp8(const Tensor& q) { return q.scalar_type() == ScalarType::Float8_e4m3fn; }

// The output's dtype: out_dtype if given (check_fp8 validated it), else bf16 for FP8 inputs and
// q's dtype otherwise.
inline ScalarType out_scalar_type(const Options& opt, const Tensor& q) {
  if (opt.out_dtype.has_value()) return *opt.out_dtype;
  return is_fp8(q) ? ScalarType::BFloat16 : q.scalar_type();
}

// Batch / head strides of a (B or 1, H or 1, ...) block-mask count tensor, 0 where it
// broadcasts; the index tensor is the count tensor's layout times its last dimension.
inline void block_mask_strides(const Tensor& num, int64_t& batch_stride, int64_t& head_stride) {
  batch_stride = num.size(0) == 1 ? 0 : num.size(1) * num.size(2);
  head_stride = num.size(1) == 1 ? 0 : num.size(2);
}

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
    case ScalarType::Float8_e4m3fn: return DType::kFloat8E4M3;
    default: return DType::kFloat32;
  }
}

// Strides of a (B, S, H, d) tensor (paged: (num_pages, page_size, H, d)) or of a varlen
// (total, H, d) one as (batch, row, head); batch is 0 in varlen.
struct Strides3 {
  int64_t batch, row, head;
};
inline Strides3 strides_of(const Tensor& t) {
  if (t.dim() == 3) return {0, t.stride(0), t.stride(1)};
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
  auto sq = strides_of(q), sk = strides_of(k), sv = strides_of(v);
  const int64_t dv = pb.headdim_v;
  auto so = out ? strides_of(*out)
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
  p.out_dtype = to_dtype(out ? out->scalar_type() : out_scalar_type(opt, q));
  const auto descale = [](const std::optional<Tensor>& t, const float*& ptr, int64_t& stride) {
    if (!t.has_value()) return;
    ptr = static_cast<const float*>(t->data_ptr());
    stride = t->stride(0);
  };
  descale(opt.q_descale, p.q_descale_ptr, p.q_descale_batch_stride);
  descale(opt.k_descale, p.k_descale_ptr, p.k_descale_batch_stride);
  descale(opt.v_descale, p.v_descale_ptr, p.v_descale_batch_stride);
  p.softmax_scale = static_cast<float>(opt.softmax_scale);
  p.softmax_scale_log2 = static_cast<float>(opt.softmax_scale * M_LOG2E);
  p.softcap = static_cast<float>(opt.softcap);
  // As flash-attn: a window side at least seqlen_k wide (max_seqlen_k for varlen) is
  // unbounded. This matters when seqlen_q > seqlen_k (the diagonal shifts left). Not with
  // position offsets: their diagonal moves by the offsets, so any width can matter.
  const bool positions = opt.q_pos_offset.has_value() || opt.k_pos_offset.has_value();
  int64_t wl = opt.window_left, wr = opt.causal ? 0 : opt.window_right;
  if (!positions && wl >= pb.seqlen_k) wl = -1;
  if (!positions && !opt.causal && wr >= pb.seqlen_k) wr = -1;
  p.window_left = static_cast<int32_t>(wl);
  p.window_right = static_cast<int32_t>(wr);
  if (opt.alibi_slopes.has_value()) {
    const Tensor& a = *opt.alibi_slopes;
    p.alibi_slopes = static_cast<const float*>(a.data_ptr());
    p.alibi_batch_stride = a.dim() == 2 ? a.stride(0) : 0;
  }
  if (opt.q_pos_offset.has_value())
    p.q_pos_offset = static_cast<const int32_t*>(opt.q_pos_offset->data_ptr());
  if (opt.k_pos_offset.has_value())
    p.k_pos_offset = static_cast<const int32_t*>(opt.k_pos_offset->data_ptr());
  if (opt.learnable_sink.has_value())
    p.sink_ptr = static_cast<const float*>(opt.learnable_sink->data_ptr());
  p.dropout_p = static_cast<float>(opt.dropout_p);
  p.dropout_threshold = dropout_threshold_u8(p.dropout_p);
  // flash-attn's scale, 1 / (1 - p) of the p asked for (params.h: not of the quantised p).
  p.dropout_scale = p.dropout_threshold ? static_cast<float>(1.0 / (1.0 - opt.dropout_p)) : 1.f;
  if (opt.rng_state.has_value())
    p.rng_state = static_cast<const int64_t*>(opt.rng_state->data_ptr());
  p.block_m = static_cast<int32_t>(opt.block_m);
  p.block_n = static_cast<int32_t>(opt.block_n);
  p.n_qblocks = static_cast<int32_t>((pb.seqlen_q + opt.block_m - 1) / opt.block_m);
  p.n_kblocks = static_cast<int32_t>((pb.seqlen_k + opt.block_n - 1) / opt.block_n);
  if (opt.kv_num_blocks.has_value()) {
    p.kv_num_blocks = static_cast<const int32_t*>(opt.kv_num_blocks->data_ptr());
    p.kv_indices = static_cast<const int32_t*>(opt.kv_indices->data_ptr());
    block_mask_strides(*opt.kv_num_blocks, p.bs_batch_stride, p.bs_head_stride);
  }
}

// The backward's block-mask view (the kept query blocks of each key block), when given.
inline void fill_bwd_block_mask(BwdParams& p, const Options& opt) {
  if (!opt.q_num_blocks.has_value()) return;
  p.q_num_blocks = static_cast<const int32_t*>(opt.q_num_blocks->data_ptr());
  p.q_indices = static_cast<const int32_t*>(opt.q_indices->data_ptr());
  block_mask_strides(*opt.q_num_blocks, p.bs_t_batch_stride, p.bs_t_head_stride);
}

inline void fill_bwd_params(BwdParams& p, const Problem& pb, const Tensor& dout, const Tensor& q,
                            const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, const Tensor& dsoftmax_sum, const Tensor* dsink,
                            const Options& opt, const Tensor* cu_q, const Tensor* cu_k) {
  fill_fwd_params(p, pb, q, k, v, &out, &lse, opt, cu_q, cu_k);
  fill_bwd_block_mask(p, opt);
  p.do_ptr = dout.data_ptr();
  auto sdo = strides_of(dout), sdq = strides_of(dq), sdk = strides_of(dk),
       sdv = strides_of(dv);
  p.do_batch_stride = sdo.batch, p.do_row_stride = sdo.row, p.do_head_stride = sdo.head;
  p.dq_ptr = dq.data_ptr();
  p.dq_batch_stride = sdq.batch, p.dq_row_stride = sdq.row, p.dq_head_stride = sdq.head;
  p.dk_ptr = dk.data_ptr();
  p.dk_batch_stride = sdk.batch, p.dk_row_stride = sdk.row, p.dk_head_stride = sdk.head;
  p.dv_ptr = dv.data_ptr();
  p.dv_batch_stride = sdv.batch, p.dv_row_stride = sdv.row, p.dv_head_stride = sdv.head;
  p.dsoftmax_sum = static_cast<float*>(dsoftmax_sum.data_ptr());
  if (dsink) p.dsink_ptr = static_cast<float*>(dsink->data_ptr());
  p.deterministic = opt.deterministic;
}

// The KV cache / paged inputs of a call, validated by the op (flash_api.cpp). Paged: k / v
// are (num_pages, page_size, nheads_k, d) and pb.seqlen_k is max_pages_per_seq * page_size.
struct KvCache {
  const Tensor* cache_seqlens = nullptr;  // seqused_k
  const Tensor* cache_leftpad = nullptr;  // leftpad_k
  const Tensor* cache_batch_idx = nullptr;
  const Tensor* block_table = nullptr;
  int64_t kv_batch = 0;  // k / v's batch size (cache_batch_idx is clamped to it)
  int64_t seqlen_knew = 0;
  int64_t page_size = 0, num_pages = 0;
  int64_t num_splits = 0;
};

inline const int32_t* i32_ptr(const Tensor* t) {
  return t ? static_cast<const int32_t*>(t->data_ptr()) : nullptr;
}

// The kvcache / paged fields of FwdParams, after fill_fwd_params.
inline void fill_kvcache_params(FwdParams& p, const KvCache& kv) {
  p.seqused_k = i32_ptr(kv.cache_seqlens);
  p.leftpad_k = i32_ptr(kv.cache_leftpad);
  p.kv_batch_idx = i32_ptr(kv.cache_batch_idx);
  p.kv_batch = static_cast<int32_t>(kv.kv_batch);
  p.seqlen_knew = static_cast<int32_t>(kv.seqlen_knew);
  if (kv.block_table) {
    p.block_table = i32_ptr(kv.block_table);
    p.block_table_batch_stride = kv.block_table->stride(0);
    p.page_size = static_cast<int32_t>(kv.page_size);
    p.num_pages = static_cast<int32_t>(kv.num_pages);
    p.max_pages_per_seq = static_cast<int32_t>(kv.block_table->size(1));
    // The capacity (params.h); a varlen call's pb.seqlen_k is its max_seqlen_k, which the
    // window was normalised with, as flash-attn does.
    p.seqlen_k = p.max_pages_per_seq * p.page_size;
  }
  p.num_splits = static_cast<int32_t>(kv.num_splits);
}

// The append + rotary step (params.h, KvAppendParams) of a call whose FwdParams are filled:
// k_new / v_new are (batch, seqlen_knew, nheads_k, d / dv) or null, cos / sin
// (seqlen_ro, rotary_dim / 2) with one row stride, or null; q_rot has q's shape.
inline void fill_kvappend_params(KvAppendParams& a, const FwdParams& p, const Tensor* k_new,
                                 const Tensor* v_new, const Tensor* cos, const Tensor* sin,
                                 bool interleaved, const Tensor* q_rot) {
  if (k_new && v_new) {
    a.knew_ptr = k_new->data_ptr();
    a.vnew_ptr = v_new->data_ptr();
    auto sk = strides_of(*k_new), sv = strides_of(*v_new);
    a.knew_batch_stride = sk.batch, a.knew_row_stride = sk.row, a.knew_head_stride = sk.head;
    a.vnew_batch_stride = sv.batch, a.vnew_row_stride = sv.row, a.vnew_head_stride = sv.head;
  }
  if (cos && sin) {
    a.rotary_cos = cos->data_ptr();
    a.rotary_sin = sin->data_ptr();
    a.rotary_stride = cos->stride(0);
    a.seqlen_ro = static_cast<int32_t>(cos->size(0));
    a.rotary_dim = static_cast<int32_t>(2 * cos->size(1));
    a.rotary_interleaved = interleaved;
    // As flash-attn: q rows at their own positions when causal or local (the window is
    // normalised by fill_fwd_params), all at the cache length otherwise.
    a.q_rot_per_row = p.window_left >= 0 || p.window_right >= 0;
  }
  if (q_rot) {
    a.q_rot_ptr = q_rot->data_ptr();
    auto sr = strides_of(*q_rot);
    a.q_rot_batch_stride = sr.batch, a.q_rot_row_stride = sr.row, a.q_rot_head_stride = sr.head;
  }
}

}  // namespace flashattn::api
