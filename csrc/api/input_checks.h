// The ops' input checks (csrc/api/flash_api.cpp): shapes, dtypes, devices, options and
// metadata of every op, each failure naming the argument and what was expected; the problem
// sizes (Problem) they return, and the KV-cache / paged fields (KvCache) they fill.
#pragma once
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "../common/tile_policy.h"
#include "checks.h"
#include "params_fill.h"

namespace flashattn::api {

inline void check_options(const Options& opt, const Problem& pb, const Tensor& q) {
  FLASHATTN_CHECK(opt.window_left >= -1, "window_size[0] (window_left) must be >= -1, got ",
                  opt.window_left);
  FLASHATTN_CHECK(opt.window_right >= -1, "window_size[1] (window_right) must be >= -1, got ",
                  opt.window_right);
  FLASHATTN_CHECK(opt.softcap >= 0.0 && std::isfinite(opt.softcap),
                  "softcap must be finite and >= 0 (0 disables it), got ", opt.softcap);
  FLASHATTN_CHECK(std::isfinite(opt.softmax_scale), "softmax_scale must be finite, got ",
                  opt.softmax_scale);
  if (opt.alibi_slopes.has_value()) {
    const Tensor& a = *opt.alibi_slopes;
    FLASHATTN_CHECK(a.scalar_type() == ScalarType::Float,
                    "alibi_slopes must have dtype float32, got ", dtype_name(a.scalar_type()));
    check_same_device(a, "alibi_slopes", q);
    const bool shape_ok = (a.dim() == 1 && a.size(0) == pb.nheads) ||
                          (a.dim() == 2 && a.size(0) == pb.batch && a.size(1) == pb.nheads);
    FLASHATTN_CHECK(shape_ok, "alibi_slopes must have shape (nheads,) = (", pb.nheads,
                    ",) or (batch, nheads) = (", pb.batch, ", ", pb.nheads, "), got ",
                    shape_str(a));
    check_last_contiguous(a, "alibi_slopes");
  }
}

// Dropout and sinks (params.h). need_rng: a call that runs (kernel_path only asks, without
// rng_state).
inline void check_features(const Options& opt, const Problem& pb, const Tensor& q, bool need_rng) {
  FLASHATTN_CHECK(opt.dropout_p >= 0.0 && opt.dropout_p < 1.0,
                  "dropout_p must be in [0, 1) (0 disables it), got ", opt.dropout_p);
  FLASHATTN_CHECK(!need_rng || opt.dropout_p == 0.0 || opt.rng_state.has_value(),
                  "dropout_p > 0 needs rng_state: int64 (2,) = (seed, offset) on q's device "
                  "(flashattn's functions draw it with torch.randint)");
  if (opt.rng_state.has_value()) {
    const Tensor& r = *opt.rng_state;
    FLASHATTN_CHECK(r.scalar_type() == ScalarType::Long, "rng_state must have dtype int64, got ",
                    dtype_name(r.scalar_type()));
    FLASHATTN_CHECK(r.dim() == 1 && r.size(0) == 2, "rng_state must have shape (2,) (seed, "
                    "offset), got ", shape_str(r));
    check_same_device(r, "rng_state", q);
    FLASHATTN_CHECK(r.is_contiguous(), "rng_state must be contiguous");
  }
  if (opt.learnable_sink.has_value()) {
    const Tensor& a = *opt.learnable_sink;
    FLASHATTN_CHECK(a.scalar_type() == ScalarType::Float,
                    "learnable_sink must have dtype float32, got ", dtype_name(a.scalar_type()));
    FLASHATTN_CHECK(a.dim() == 1 && a.size(0) == pb.nheads, "learnable_sink must have shape "
                    "(nheads,) = (", pb.nheads, ",), got ", shape_str(a));
    check_same_device(a, "learnable_sink", q);
    check_last_contiguous(a, "learnable_sink");
  }
}

// FP8 (params.h, schema.h; issue 14), the same on every backend. A forward of float8_e4m3fn
// inputs takes fp32 (batch, nheads_k) descales, out_dtype bf16 / fp16 and causal / window /
// GQA / varlen / softcap; it refuses ALiBi, dropout, sinks, block masks and paged KV (the
// refused options' names in the message). Other dtypes take neither descales nor an out_dtype
// other than their own: a descale is never silently dropped (FA3 ignores them there).
inline void check_fp8(const Options& opt, const Problem& pb, const Tensor& q, bool paged) {
  const std::pair<const std::optional<Tensor>*, const char*> descales[] = {
      {&opt.q_descale, "q_descale"}, {&opt.k_descale, "k_descale"}, {&opt.v_descale, "v_descale"}};
  if (!is_fp8(q)) {
    for (const auto& [t, name] : descales)
      FLASHATTN_CHECK(!t->has_value(), name, " is for float8_e4m3fn inputs only, but q has "
                      "dtype ", dtype_name(q.scalar_type()), " (flashattn refuses it rather "
                      "than ignore it; pass None)");
    FLASHATTN_CHECK(!opt.out_dtype || *opt.out_dtype == q.scalar_type(), "out_dtype is for "
                    "float8_e4m3fn inputs only: with q of dtype ", dtype_name(q.scalar_type()),
                    " the output has q's dtype (got out_dtype=", dtype_name(*opt.out_dtype), ")");
    return;
  }
  FLASHATTN_CHECK(!opt.out_dtype || *opt.out_dtype == ScalarType::BFloat16 ||
                      *opt.out_dtype == ScalarType::Half,
                  "out_dtype of an FP8 (float8_e4m3fn) forward must be bfloat16 (the default) "
                  "or float16, got ", dtype_name(*opt.out_dtype));
  for (const auto& [t, name] : descales) {
    if (!t->has_value()) continue;
    const Tensor& d = **t;
    FLASHATTN_CHECK(d.scalar_type() == ScalarType::Float, name, " must have dtype float32, got ",
                    dtype_name(d.scalar_type()));
    check_same_device(d, name, q);
    FLASHATTN_CHECK(d.dim() == 2 && d.size(0) == pb.batch && d.size(1) == pb.nheads_k, name,
                    " must have shape (batch, nheads_k) = (", pb.batch, ", ", pb.nheads_k,
                    ") (flashattn's functions broadcast to it), got ", shape_str(d));
    check_last_contiguous(d, name);
  }
  const char* refused = opt.alibi_slopes   ? "alibi_slopes"
                        : opt.dropout_p != 0.0 ? "dropout_p > 0"
                        : opt.learnable_sink ? "learnable_sink"
                        : (opt.kv_num_blocks || opt.kv_indices || opt.q_num_blocks ||
                           opt.q_indices)
                            ? "a block mask (block-sparse attention)"
                        : paged ? "block_table (paged KV)"
                                : nullptr;
  FLASHATTN_CHECK(refused == nullptr, "FP8 (float8_e4m3fn) attention does not take ", refused,
                  " (issue 14: it takes causal, window_size, GQA / MQA, varlen and softcap; "
                  "refused on every backend alike)");
}

// dtype int32, on q's device, contiguous: the metadata the kernels index directly.
inline void check_int32_meta(const Tensor& t, const char* name, const Tensor& q) {
  FLASHATTN_CHECK(t.scalar_type() == ScalarType::Int, name, " must have dtype int32, got ",
                  dtype_name(t.scalar_type()));
  check_same_device(t, name, q);
  FLASHATTN_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// Position offsets (params.h, schema.h): int32 (batch,) on q's device, contiguous. Their values
// are not read here (that would be a host sync on CUDA): the kernels clamp them.
inline void check_pos_offsets(const Options& opt, const Problem& pb, const Tensor& q) {
  for (const auto& [t, name] : {std::pair{&opt.q_pos_offset, "q_pos_offset"},
                                {&opt.k_pos_offset, "k_pos_offset"}}) {
    if (!t->has_value()) continue;
    const Tensor& o = **t;
    FLASHATTN_CHECK(o.dim() == 1 && o.size(0) == pb.batch, name, " must have shape (batch,) = (",
                    pb.batch, ",) (varlen: one offset per sequence), got ", shape_str(o));
    check_int32_meta(o, name, q);
  }
  if (!opt.q_pos_offset && !opt.k_pos_offset) return;
  // The API passes such a window as given (params_fill.h), so it must fit the kernels' int32.
  FLASHATTN_CHECK(opt.window_left < std::numeric_limits<int32_t>::max() &&
                      opt.window_right < std::numeric_limits<int32_t>::max(),
                  "window_size with q_pos_offset / k_pos_offset must be below 2^31 - 1 on each "
                  "side (or -1), got (", opt.window_left, ", ", opt.window_right, ")");
}

// One block-mask pair (schema.h): counts int32 (B or 1, H or 1, rows), indices int32 (B or 1,
// H or 1, rows, cols) with the counts' first dimensions; contiguous, on q's device.
inline void check_block_pair(const Tensor& num, const char* nn, const Tensor& idx, const char* in,
                             const Tensor& q, const Problem& pb, int64_t rows, int64_t cols,
                             const char* rows_what, const char* cols_what) {
  check_int32_meta(num, nn, q);
  check_int32_meta(idx, in, q);
  const bool num_ok = num.dim() == 3 && (num.size(0) == pb.batch || num.size(0) == 1) &&
                      (num.size(1) == pb.nheads || num.size(1) == 1) && num.size(2) == rows;
  FLASHATTN_CHECK(num_ok, nn, " must have shape (batch or 1, nheads or 1, ", rows_what, ") = (",
                  pb.batch, " or 1, ", pb.nheads, " or 1, ", rows, "), got ", shape_str(num));
  const bool idx_ok = idx.dim() == 4 && idx.size(0) == num.size(0) &&
                      idx.size(1) == num.size(1) && idx.size(2) == rows && idx.size(3) == cols;
  FLASHATTN_CHECK(idx_ok, in, " must have shape (", num.size(0), ", ", num.size(1), ", ",
                  rows_what, ", ", cols_what, ") = (", num.size(0), ", ", num.size(1), ", ",
                  rows, ", ", cols, ") (", nn, "'s first dimensions), got ", shape_str(idx));
}

// Block-sparse arguments (schema.h). backward: the transposed view is needed too.
inline void check_block_sparse(const Options& opt, const Problem& pb, const Tensor& q,
                               bool backward, bool paged) {
  const bool any = opt.kv_num_blocks || opt.kv_indices || opt.q_num_blocks || opt.q_indices;
  if (!any) return;
  FLASHATTN_CHECK(!paged, "block-sparse attention does not take block_table (paged KV)");
  FLASHATTN_CHECK(opt.kv_num_blocks.has_value() == opt.kv_indices.has_value(),
                  "kv_num_blocks and kv_indices must be given together");
  FLASHATTN_CHECK(opt.q_num_blocks.has_value() == opt.q_indices.has_value(),
                  "q_num_blocks and q_indices must be given together");
  FLASHATTN_CHECK(opt.kv_num_blocks.has_value() && (!backward || opt.q_num_blocks.has_value()),
                  backward ? "the block-sparse backward needs kv_num_blocks / kv_indices and "
                             "their transposed view q_num_blocks / q_indices "
                             "(block_sparse_attn_func builds it)"
                           : "q_num_blocks / q_indices (the transposed view) need "
                             "kv_num_blocks / kv_indices");
  const auto check_bs = [](int64_t bs, const char* name) {
    FLASHATTN_CHECK(bs >= 16 && bs <= 256 && bs % 16 == 0, name,
                    " must be a multiple of 16 in [16, 256], got ", bs);
  };
  check_bs(opt.block_m, "block_size_m");
  check_bs(opt.block_n, "block_size_n");
  const int64_t nq = (pb.seqlen_q + opt.block_m - 1) / opt.block_m;
  const int64_t nk = (pb.seqlen_k + opt.block_n - 1) / opt.block_n;
  check_block_pair(*opt.kv_num_blocks, "kv_num_blocks", *opt.kv_indices, "kv_indices", q, pb,
                   nq, nk, "ceil(seqlen_q / block_size_m)", "ceil(seqlen_k / block_size_n)");
  if (opt.q_num_blocks)
    check_block_pair(*opt.q_num_blocks, "q_num_blocks", *opt.q_indices, "q_indices", q, pb, nk,
                     nq, "ceil(seqlen_k / block_size_n)", "ceil(seqlen_q / block_size_m)");
}

// q's dtype (float32 on CPU only; float8_e4m3fn for the FP8 forward, which check_fp8 limits
// further) and device; k and v (named kn, vn) the same; every last dimension contiguous.
inline void check_dtypes(const Tensor& q, const Tensor& k, const char* kn, const Tensor& v,
                         const char* vn) {
  const ScalarType t = q.scalar_type();
  FLASHATTN_CHECK(t == ScalarType::Half || t == ScalarType::BFloat16 ||
                      t == ScalarType::Float8_e4m3fn || (t == ScalarType::Float && q.is_cpu()),
                  "q must have dtype float16, bfloat16", q.is_cpu() ? ", float32" : "",
                  " or float8_e4m3fn (FP8, forward only; float32 runs on CPU only), got ",
                  dtype_name(t));
#ifdef FLASHATTN_DISABLE_FP8
  FLASHATTN_CHECK(t != ScalarType::Float8_e4m3fn, kFp8Disabled);
#endif
  FLASHATTN_CHECK(k.scalar_type() == t, kn, " must have the same dtype as q (", dtype_name(t),
                  "), got ", dtype_name(k.scalar_type()));
  FLASHATTN_CHECK(v.scalar_type() == t, vn, " must have the same dtype as q (", dtype_name(t),
                  "), got ", dtype_name(v.scalar_type()));
  FLASHATTN_CHECK(q.is_cpu() || q.is_cuda(), "q must be a CPU or CUDA tensor");
  check_same_device(k, kn, q);
  check_same_device(v, vn, q);
  check_last_contiguous(q, "q");
  check_last_contiguous(k, kn);
  check_last_contiguous(v, vn);
}

// Heads and head dims into pb: q's at dimension oq (heads, then headdim), k's and v's at ok.
inline void check_heads(Problem& pb, const Tensor& q, int64_t oq, const Tensor& k, const char* kn,
                        const Tensor& v, const char* vn, int64_t ok) {
  pb.nheads = q.size(oq);
  pb.nheads_k = k.size(ok);
  pb.headdim = q.size(oq + 1);
  pb.headdim_v = v.size(ok + 1);
  check_size(v, vn, ok, pb.nheads_k, "nheads (must equal k's)");
  check_size(k, kn, ok + 1, pb.headdim, "headdim (must equal q's)");
  FLASHATTN_CHECK(pb.headdim >= 1 && pb.headdim <= kMaxHeadDim,
                  "q headdim must be between 1 and ", kMaxHeadDim, ", got ", pb.headdim);
  FLASHATTN_CHECK(pb.headdim_v >= 1 && pb.headdim_v <= kMaxHeadDim, vn,
                  " headdim must be between 1 and ", kMaxHeadDim, ", got ", pb.headdim_v);
  FLASHATTN_CHECK(pb.nheads_k >= 1 && pb.nheads >= 1, "q and ", kn,
                  " must have at least one head, got ", pb.nheads, " and ", pb.nheads_k);
  FLASHATTN_CHECK(pb.nheads < std::numeric_limits<int32_t>::max(), "q has too many heads (",
                  pb.nheads, ")");
  FLASHATTN_CHECK(pb.nheads % pb.nheads_k == 0, "nheads of q (", pb.nheads,
                  ") must be divisible by nheads of ", kn, " and ", vn, " (", pb.nheads_k, ")");
}

inline void check_rows(const Problem& pb) {
  FLASHATTN_CHECK(pb.total_q < std::numeric_limits<int32_t>::max() &&
                      pb.total_k < std::numeric_limits<int32_t>::max() &&
                      pb.seqlen_k < std::numeric_limits<int32_t>::max(),
                  "too many tokens: q and k must have fewer than 2^31 rows");
}

// Validates q, k, v and returns the problem sizes. Padded: (B, S, H, d); varlen: (total, H, d).
inline Problem check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, bool varlen) {
  const char* layout = varlen ? "(total_tokens, nheads, headdim)" : "(batch, seqlen, nheads, headdim)";
  const int64_t nd = varlen ? 3 : 4;
  check_dim(q, "q", nd, layout);
  check_dim(k, "k", nd, layout);
  check_dim(v, "v", nd, layout);
  check_dtypes(q, k, "k", v, "v");
  Problem pb;
  pb.varlen = varlen;
  const int64_t o = varlen ? 1 : 2;  // index of the heads dimension
  if (!varlen) {
    pb.batch = q.size(0);
    pb.seqlen_q = q.size(1);
    pb.seqlen_k = k.size(1);
    check_size(k, "k", 0, pb.batch, "batch size");
    check_size(v, "v", 0, pb.batch, "batch size");
    check_size(v, "v", 1, pb.seqlen_k, "seqlen (dim 1, must equal k's)");
    pb.total_q = pb.batch * pb.seqlen_q;
    pb.total_k = pb.batch * pb.seqlen_k;
  } else {
    pb.total_q = q.size(0);
    pb.total_k = k.size(0);
    check_size(v, "v", 0, pb.total_k, "total_tokens (dim 0, must equal k's)");
  }
  check_heads(pb, q, o, k, "k", v, "v", o);
  check_rows(pb);
  return pb;
}

inline void check_cu_seqlens(const Tensor& cu, const char* name, const Tensor& q, int64_t batch) {
  FLASHATTN_CHECK(cu.dim() == 1 && cu.size(0) >= 1, name,
                  " must be 1-D with batch + 1 entries, got shape ", shape_str(cu));
  FLASHATTN_CHECK(batch < 0 || cu.size(0) == batch + 1, name, " must have batch + 1 = ", batch + 1,
                  " entries (like cu_seqlens_q), got ", cu.size(0));
  check_int32_meta(cu, name, q);
}

inline void check_max_seqlen(int64_t m, const char* name) {
  FLASHATTN_CHECK(m >= 0 && m < std::numeric_limits<int32_t>::max(), name,
                  " must be in [0, 2^31), got ", m);
}

// Checks that t has exactly `like`'s shape (used for dout / out against q-shaped outputs).
inline void check_shape_like(const Tensor& t, const char* name, const std::vector<int64_t>& shape) {
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = t.size(i) == shape[i];
  std::string want = "(";
  for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
  FLASHATTN_CHECK(ok, name, " must have shape ", want, "), got ", shape_str(t));
}

// block_table: int32 (batch, max_num_blocks_per_seq) on q's device, last dim contiguous; k / v
// (named kn, vn) then hold pages (num_blocks, page_block_size, nheads_k, d / dv). Fills kv's
// paged fields and returns the capacity, max_num_blocks_per_seq * page_block_size.
inline int64_t check_paged(const Tensor& bt, const Tensor& q, int64_t batch, const Tensor& k,
                           const char* kn, const Tensor& v, const char* vn, KvCache& kv) {
  FLASHATTN_CHECK(bt.scalar_type() == ScalarType::Int, "block_table must have dtype int32, got ",
                  dtype_name(bt.scalar_type()));
  FLASHATTN_CHECK(bt.dim() == 2 && bt.size(0) == batch,
                  "block_table must have shape (batch, max_num_blocks_per_seq) with batch = ",
                  batch, ", got ", shape_str(bt));
  check_same_device(bt, "block_table", q);
  check_last_contiguous(bt, "block_table");
  const char* layout = "(num_blocks, page_block_size, nheads_k, headdim) with block_table";
  check_dim(k, kn, 4, layout);
  check_dim(v, vn, 4, layout);
  check_size(v, vn, 0, k.size(0), "num_blocks (dim 0, must equal k's)");
  check_size(v, vn, 1, k.size(1), "page_block_size (dim 1, must equal k's)");
  kv.block_table = &bt;
  kv.num_pages = k.size(0);
  kv.page_size = k.size(1);
  FLASHATTN_CHECK(kv.page_size > 0 && kv.page_size % 16 == 0, "the page size (", kn,
                  " dim 1, page_block_size) must be a positive multiple of 16, got ",
                  kv.page_size);
  const int64_t capacity = bt.size(1) * kv.page_size;
  FLASHATTN_CHECK(capacity < std::numeric_limits<int32_t>::max(),
                  "block_table: max_num_blocks_per_seq * page_block_size (", bt.size(1), " * ",
                  kv.page_size, ") must be below 2^31");
  return capacity;
}

// block_table (paged prefill): k / v are pages, which check_paged validates into kv.
inline Problem check_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                            const Tensor& cu_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                            const Tensor* block_table = nullptr, KvCache* kv = nullptr) {
  Problem pb = block_table ? Problem{} : check_qkv(q, k, v, /*varlen=*/true);
  check_cu_seqlens(cu_q, "cu_seqlens_q", q, -1);
  check_cu_seqlens(cu_k, "cu_seqlens_k", q, cu_q.size(0) - 1);
  check_max_seqlen(max_seqlen_q, "max_seqlen_q");
  check_max_seqlen(max_seqlen_k, "max_seqlen_k");
  pb.batch = cu_q.size(0) - 1;
  int64_t max_rows_k = pb.total_k;
  if (block_table) {
    check_dim(q, "q", 3, "(total_tokens, nheads, headdim)");
    max_rows_k = check_paged(*block_table, q, pb.batch, k, "k", v, "v", *kv);
    check_dtypes(q, k, "k", v, "v");
    pb.varlen = true;
    check_heads(pb, q, 1, k, "k", v, "v", 2);
    pb.total_q = q.size(0);
    pb.total_k = kv->num_pages * kv->page_size;
    check_rows(pb);
  }
  // No sequence is longer than its tensor (paged: the block table's capacity): clamping the
  // hints keeps grid and workspace sizes in 32-bit range whatever the caller passes.
  pb.seqlen_q = std::min(max_seqlen_q, pb.total_q);
  pb.seqlen_k = std::min(max_seqlen_k, max_rows_k);
  return pb;
}

// q (B, Sq, H, d); k_cache / v_cache (B_cache, Sk, Hk, d / dv), or with block_table the pages
// (num_blocks, page_block_size, Hk, d / dv). pb.seqlen_k is the capacity of a sequence.
inline Problem check_kvcache(const Tensor& q, const Tensor& kc, const Tensor& vc,
                             const std::optional<Tensor>& block_table, bool has_batch_idx,
                             KvCache& kv) {
  check_dim(q, "q", 4, "(batch, seqlen, nheads, headdim)");
  Problem pb;
  pb.batch = q.size(0);
  pb.seqlen_q = q.size(1);
  pb.total_q = pb.batch * pb.seqlen_q;
  if (block_table) {
    FLASHATTN_CHECK(!has_batch_idx, "cache_batch_idx cannot be combined with block_table (a "
                    "paged cache is addressed through block_table)");
    pb.seqlen_k = check_paged(*block_table, q, pb.batch, kc, "k_cache", vc, "v_cache", kv);
  } else {
    const char* layout = "(batch_cache, seqlen_cache, nheads_k, headdim)";
    check_dim(kc, "k_cache", 4, layout);
    check_dim(vc, "v_cache", 4, layout);
    check_size(vc, "v_cache", 0, kc.size(0), "batch size (dim 0, must equal k_cache's)");
    check_size(vc, "v_cache", 1, kc.size(1), "seqlen (dim 1, must equal k_cache's)");
    FLASHATTN_CHECK(has_batch_idx || kc.size(0) >= pb.batch, "k_cache has batch size ",
                    kc.size(0), " but q has ", pb.batch, ": without cache_batch_idx, sequence b "
                    "reads cache batch b");
    pb.seqlen_k = kc.size(1);
    kv.kv_batch = kc.size(0);
  }
  check_dtypes(q, kc, "k_cache", vc, "v_cache");
  check_heads(pb, q, 2, kc, "k_cache", vc, "v_cache", 2);
  pb.total_k = kc.size(0) * kc.size(1);
  check_rows(pb);
  return pb;
}

// cache_seqlens, cache_batch_idx, cache_leftpad: int32 (batch,).
inline const Tensor* check_batch_vector(const std::optional<Tensor>& t, const char* name,
                                        const Tensor& q, int64_t batch) {
  if (!t) return nullptr;
  FLASHATTN_CHECK(t->dim() == 1 && t->size(0) == batch, name, " must have shape (batch,) = (",
                  batch, ",), got ", shape_str(*t));
  check_int32_meta(*t, name, q);
  return &*t;
}

// k / v, the rows to append: (batch, seqlen_new, nheads_k, d / dv), like q and the caches.
// Returns seqlen_new (0 without them).
inline int64_t check_new_kv(const std::optional<Tensor>& k, const std::optional<Tensor>& v,
                            const Tensor& q, const Problem& pb, bool has_seqlens) {
  if (!k && !v) return 0;
  FLASHATTN_CHECK(k && v, "k and v (the rows to append to the cache) must be given together, "
                  "got only ", k ? "k" : "v");
  FLASHATTN_CHECK(has_seqlens, "k and v need cache_seqlens (the cache rows they go to)");
  const char* layout = "(batch, seqlen_new, nheads_k, headdim)";
  check_dim(*k, "k", 4, layout);
  check_dim(*v, "v", 4, layout);
  check_dtypes(q, *k, "k", *v, "v");
  check_size(*k, "k", 0, pb.batch, "batch size (must equal q's)");
  check_size(*v, "v", 0, pb.batch, "batch size (must equal q's)");
  check_size(*v, "v", 1, k->size(1), "seqlen_new (dim 1, must equal k's)");
  check_size(*k, "k", 2, pb.nheads_k, "nheads (must equal k_cache's)");
  check_size(*v, "v", 2, pb.nheads_k, "nheads (must equal v_cache's)");
  check_size(*k, "k", 3, pb.headdim, "headdim (must equal q's)");
  check_size(*v, "v", 3, pb.headdim_v, "headdim (must equal v_cache's)");
  FLASHATTN_CHECK(k->size(1) <= pb.seqlen_k, "k has seqlen_new ", k->size(1),
                  " rows, more than the cache holds (", pb.seqlen_k, ")");
  return k->size(1);
}

// rotary_cos / rotary_sin: (seqlen_ro, rotary_dim / 2) in q's dtype, rotary_dim even and at
// most headdim, seqlen_ro at least the capacity. Made contiguous where their layouts differ
// (the kernels take one row stride for both).
inline void check_rotary(std::optional<Tensor>& cos, std::optional<Tensor>& sin, const Tensor& q,
                         const Problem& pb, bool has_seqlens) {
  if (!cos && !sin) return;
  FLASHATTN_CHECK(cos && sin, "rotary_cos and rotary_sin must be given together, got only ",
                  cos ? "rotary_cos" : "rotary_sin");
  FLASHATTN_CHECK(has_seqlens, "rotary_cos / rotary_sin need cache_seqlens (the positions)");
  for (const auto& [t, name] : {std::pair{&*cos, "rotary_cos"}, {&*sin, "rotary_sin"}}) {
    check_dim(*t, name, 2, "(seqlen_ro, rotary_dim / 2)");
    FLASHATTN_CHECK(t->scalar_type() == q.scalar_type(), name, " must have q's dtype (",
                    dtype_name(q.scalar_type()), "), got ", dtype_name(t->scalar_type()));
    check_same_device(*t, name, q);
  }
  check_size(*sin, "rotary_sin", 0, cos->size(0), "seqlen_ro (dim 0, must equal rotary_cos's)");
  check_size(*sin, "rotary_sin", 1, cos->size(1),
             "rotary_dim / 2 (dim 1, must equal rotary_cos's)");
  const int64_t rotary_dim = 2 * cos->size(1);
  FLASHATTN_CHECK(rotary_dim >= 2 && rotary_dim <= pb.headdim, "rotary_cos has ", cos->size(1),
                  " columns: rotary_dim = 2 * that must be between 2 and headdim (", pb.headdim,
                  ")");
  FLASHATTN_CHECK(cos->size(0) >= pb.seqlen_k, "rotary_cos / rotary_sin have ", cos->size(0),
                  " rows (seqlen_ro), fewer than the cache capacity (", pb.seqlen_k, ")");
  if (cos->stride(-1) != 1 || sin->stride(-1) != 1 || cos->stride(0) != sin->stride(0)) {
    cos = torch::stable::contiguous(*cos);
    sin = torch::stable::contiguous(*sin);
  }
}

// The checks of a padded call, or of a varlen one when cu_seqlens_q / cu_seqlens_k are given.
inline Problem check_either(const Tensor& q, const Tensor& k, const Tensor& v,
                            const std::optional<Tensor>& cu_seqlens_q,
                            const std::optional<Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                            int64_t max_seqlen_k) {
  FLASHATTN_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
                  "cu_seqlens_q and cu_seqlens_k must be given together (varlen) or not at all");
  if (!cu_seqlens_q) return check_qkv(q, k, v, /*varlen=*/false);
  return check_varlen(q, k, v, *cu_seqlens_q, *cu_seqlens_k, max_seqlen_q, max_seqlen_k);
}

}  // namespace flashattn::api
