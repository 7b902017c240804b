// The ops torch.ops.flashattn.{fwd,bwd,varlen_fwd,varlen_bwd,fwd_kvcache,attn_probs}: input checks,
// output allocation through torch, params filling, dispatch to a backend. Stable ABI only.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../common/tile_policy.h"
#include "../cpu/cpu_backend.h"
#include "backend_choice.h"
#include "checks.h"
#include "params_fill.h"
#include "schema.h"

extern "C" {
// From torch's C shim (a C symbol, stable across versions); declared here so this file
// does not need USE_CUDA while including the shim.
int32_t aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);
}

namespace flashattn::api {
namespace {

using torch::stable::Tensor;
using Tensors2 = std::tuple<Tensor, Tensor>;
using Tensors3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensors4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;

void check_options(const Options& opt, const Problem& pb, const Tensor& q) {
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
void check_features(const Options& opt, const Problem& pb, const Tensor& q, bool need_rng) {
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

void check_int32_meta(const Tensor& t, const char* name, const Tensor& q);

// One block-mask pair (schema.h): counts int32 (B or 1, H or 1, rows), indices int32 (B or 1,
// H or 1, rows, cols) with the counts' first dimensions; contiguous, on q's device.
void check_block_pair(const Tensor& num, const char* nn, const Tensor& idx, const char* in,
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
void check_block_sparse(const Options& opt, const Problem& pb, const Tensor& q, bool backward,
                        bool paged) {
  const bool any = opt.kv_num_blocks || opt.kv_indices || opt.q_num_blocks || opt.q_indices;
  if (!any) return;
  FLASHATTN_CHECK(!paged, "block-sparse attention does not take block_table (paged KV)");
  if (!q.is_cpu()) fail_cuda_block_sparse();
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

// q's dtype (float32 on CPU only) and device; k and v (named kn, vn) the same; every last
// dimension contiguous.
void check_dtypes(const Tensor& q, const Tensor& k, const char* kn, const Tensor& v,
                  const char* vn) {
  const ScalarType t = q.scalar_type();
  FLASHATTN_CHECK(t == ScalarType::Half || t == ScalarType::BFloat16 ||
                      (t == ScalarType::Float && q.is_cpu()),
                  "q must have dtype float16 or bfloat16", q.is_cpu() ? " or float32" : "",
                  " (float32 runs on CPU only), got ", dtype_name(t));
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
void check_heads(Problem& pb, const Tensor& q, int64_t oq, const Tensor& k, const char* kn,
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

void check_rows(const Problem& pb) {
  FLASHATTN_CHECK(pb.total_q < std::numeric_limits<int32_t>::max() &&
                      pb.total_k < std::numeric_limits<int32_t>::max() &&
                      pb.seqlen_k < std::numeric_limits<int32_t>::max(),
                  "too many tokens: q and k must have fewer than 2^31 rows");
}

// Validates q, k, v and returns the problem sizes. Padded: (B, S, H, d); varlen: (total, H, d).
Problem check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, bool varlen) {
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

// dtype int32, on q's device, contiguous: the metadata the kernels index directly.
void check_int32_meta(const Tensor& t, const char* name, const Tensor& q) {
  FLASHATTN_CHECK(t.scalar_type() == ScalarType::Int, name, " must have dtype int32, got ",
                  dtype_name(t.scalar_type()));
  check_same_device(t, name, q);
  FLASHATTN_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_cu_seqlens(const Tensor& cu, const char* name, const Tensor& q, int64_t batch) {
  FLASHATTN_CHECK(cu.dim() == 1 && cu.size(0) >= 1, name,
                  " must be 1-D with batch + 1 entries, got shape ", shape_str(cu));
  FLASHATTN_CHECK(batch < 0 || cu.size(0) == batch + 1, name, " must have batch + 1 = ", batch + 1,
                  " entries (like cu_seqlens_q), got ", cu.size(0));
  check_int32_meta(cu, name, q);
}

void check_max_seqlen(int64_t m, const char* name) {
  FLASHATTN_CHECK(m >= 0 && m < std::numeric_limits<int32_t>::max(), name,
                  " must be in [0, 2^31), got ", m);
}

// Checks that t has exactly `like`'s shape (used for dout / out against q-shaped outputs).
void check_shape_like(const Tensor& t, const char* name, const std::vector<int64_t>& shape) {
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = t.size(i) == shape[i];
  std::string want = "(";
  for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
  FLASHATTN_CHECK(ok, name, " must have shape ", want, "), got ", shape_str(t));
}

Tensor new_empty(const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like) {
  return torch::stable::empty(shape, dtype, std::nullopt, like.device());
}

cpu::ParallelFor cpu_parallel_for() {
  return [](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    torch::stable::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { fn(b, e); });
  };
}

[[maybe_unused]] void* current_stream(const Tensor& q) {
  void* stream = nullptr;
  FLASHATTN_CHECK(aoti_torch_get_current_cuda_stream(q.get_device_index(), &stream) == 0,
                  "could not get the current CUDA stream");
  return stream;
}

// The backend's workspace, zeroed unless `zeroed` is false, through torch's allocator (kept
// alive by the caller until the backend's work is enqueued; the caching allocator orders
// reuse on the stream).
std::pair<Tensor, Tensor> alloc_workspace(FwdParams& p, const WorkspaceSizes& ws,
                                          const Tensor& q, bool zeroed = true) {
  Tensor f32 = new_empty({ws.f32_elems}, ScalarType::Float, q);
  Tensor i32 = new_empty({ws.i32_elems}, ScalarType::Int, q);
  if (zeroed && ws.f32_elems > 0) torch::stable::zero_(f32);
  if (zeroed && ws.i32_elems > 0) torch::stable::zero_(i32);
  p.workspace_f32 = static_cast<float*>(f32.data_ptr());
  p.workspace_f32_elems = ws.f32_elems;
  p.workspace_i32 = static_cast<int32_t*>(i32.data_ptr());
  p.workspace_i32_elems = ws.i32_elems;
  return {f32, i32};
}

// Calls with a KV cache or paged keys (sm80_backend.h: the split-KV kernels take them all).
bool has_kvcache_fields(const FwdParams& p) {
  return p.seqused_k || p.leftpad_k || p.kv_batch_idx || p.block_table;
}

// The caller holds a device guard for q's device.
void dispatch_fwd_cuda_kvcache(FwdParams& p, const Tensor& q) {
  choose_fwd_kvcache(p);
#ifndef FLASHATTN_DISABLE_SM80
  // Padded: the split kernels write every partial row the combine reads (no memset); varlen:
  // rows of no sequence read zeros.
  auto ws = alloc_workspace(p, sm80::fwd_kvcache_workspace(p), q, /*zeroed=*/p.is_varlen);
  sm80::run_fwd_kvcache(p, current_stream(q));
#endif
}

// kvcache: a flash_attn_with_kvcache call (on CUDA the kvcache kernels run it, with or
// without the kvcache fields).
void dispatch_fwd(FwdParams& p, const Tensor& q, bool kvcache = false) {
  if (q.is_cpu()) return cpu::run_fwd(p, cpu_parallel_for());
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  if (kvcache || has_kvcache_fields(p)) return dispatch_fwd_cuda_kvcache(p, q);
  switch (choose_fwd(p)) {
#ifndef FLASHATTN_DISABLE_SM90
    case Backend::kSm90: return sm90::run_fwd(p, current_stream(q));
#endif
#ifndef FLASHATTN_DISABLE_SM80
    case Backend::kSm80:
    case Backend::kSm80Ptx: return sm80::run_fwd(p, current_stream(q));
    case Backend::kSm80Decode: return dispatch_fwd_cuda_kvcache(p, q);
#endif
    default: fail("the forward: no kernel of this build runs the chosen backend");
  }
}

// flash_attn_with_kvcache's append + rotary step, before its attention (same stream).
void dispatch_kvcache_append(const FwdParams& p, const KvAppendParams& a, const Tensor& q) {
  if (q.is_cpu()) return cpu::run_kvcache_append(p, a, cpu_parallel_for());
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  choose_fwd_kvcache(p);
#ifndef FLASHATTN_DISABLE_SM80
  sm80::run_kvcache_append(p, a, current_stream(q));
#endif
}

void dispatch_bwd(BwdParams& p, const Tensor& q) {
  if (q.is_cpu()) {
    auto ws = alloc_workspace(p, cpu::bwd_workspace(p), q);
    return cpu::run_bwd(p, cpu_parallel_for());
  }
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const Backend backend = choose_bwd(p);
#if !defined(FLASHATTN_DISABLE_SM90) && !defined(FLASHATTN_DISABLE_BACKWARD)
  if (backend == Backend::kSm90) {
    auto ws = alloc_workspace(p, sm90::bwd_workspace(p), q);
    return sm90::run_bwd(p, current_stream(q));
  }
#endif
#if !defined(FLASHATTN_DISABLE_SM80) && !defined(FLASHATTN_DISABLE_BACKWARD)
  if (backend == Backend::kSm80 || backend == Backend::kSm80Ptx) {
    auto ws = alloc_workspace(p, sm80::bwd_workspace(p), q);
    return sm80::run_bwd(p, current_stream(q));
  }
#endif
  fail("the backward: no kernel of this build runs the chosen backend ", backend_name(backend));
}

Options make_options(double scale, bool causal, int64_t wl, int64_t wr, double softcap,
                     std::optional<Tensor> alibi, bool deterministic) {
  return Options{scale, causal, wl, wr, softcap, std::move(alibi), deterministic};
}

Options with_features(Options opt, double dropout_p, std::optional<Tensor> rng_state,
                      std::optional<Tensor> learnable_sink) {
  opt.dropout_p = dropout_p;
  opt.rng_state = std::move(rng_state);
  opt.learnable_sink = std::move(learnable_sink);
  return opt;
}

Options with_block_mask(Options opt, std::optional<Tensor> kv_num_blocks,
                        std::optional<Tensor> kv_indices, std::optional<Tensor> q_num_blocks,
                        std::optional<Tensor> q_indices, int64_t block_m, int64_t block_n) {
  opt.kv_num_blocks = std::move(kv_num_blocks);
  opt.kv_indices = std::move(kv_indices);
  opt.q_num_blocks = std::move(q_num_blocks);
  opt.q_indices = std::move(q_indices);
  opt.block_m = block_m;
  opt.block_n = block_n;
  return opt;
}

// Fresh outputs: out (B, Sq, H, dv) / (total_q, H, dv) in q's dtype, lse (B, H, Sq) / (H, total_q).
Tensors2 new_outputs(const Problem& pb, const Tensor& q) {
  Tensor out = pb.varlen ? new_empty({pb.total_q, pb.nheads, pb.headdim_v}, q.scalar_type(), q)
                         : new_empty({pb.batch, pb.seqlen_q, pb.nheads, pb.headdim_v},
                                     q.scalar_type(), q);
  Tensor lse = pb.varlen ? new_empty({pb.nheads, pb.total_q}, ScalarType::Float, q)
                         : new_empty({pb.batch, pb.nheads, pb.seqlen_q}, ScalarType::Float, q);
  return {out, lse};
}

// Every row sees no key: out 0, lse -inf.
Tensors2 no_keys(Tensor out, Tensor lse) {
  torch::stable::zero_(out);
  torch::stable::fill_(lse, -std::numeric_limits<double>::infinity());
  return {out, lse};
}

// kv: the paged fields of a varlen call (block_table), else null.
Tensors2 run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Problem& pb,
                     const Options& opt, const Tensor* cu_q, const Tensor* cu_k,
                     const KvCache* kv = nullptr) {
  check_options(opt, pb, q);
  check_features(opt, pb, q, /*need_rng=*/true);
  check_block_sparse(opt, pb, q, /*backward=*/false, /*paged=*/kv != nullptr);
  auto [out, lse] = new_outputs(pb, q);
  if (pb.total_q == 0) return {out, lse};
  // No visible key (paged: no page); with a sink the kernels write lse = sink.
  if (!opt.learnable_sink &&
      ((!pb.varlen && pb.seqlen_k == 0) || (pb.varlen && pb.batch == 0) ||
       (kv && pb.total_k == 0)))
    return no_keys(out, lse);
  FwdParams p;
  fill_fwd_params(p, pb, q, k, v, &out, &lse, opt, cu_q, cu_k);
  if (kv) fill_kvcache_params(p, *kv);
  dispatch_fwd(p, q);
  return {out, lse};
}

Tensors4 run_backward(Tensor dout, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out, Tensor lse, const Problem& pb, const Options& opt,
                      const Tensor* cu_q, const Tensor* cu_k) {
  check_options(opt, pb, q);
  check_features(opt, pb, q, /*need_rng=*/true);
  check_block_sparse(opt, pb, q, /*backward=*/true, /*paged=*/false);
  const std::vector<int64_t> o_shape =
      pb.varlen ? std::vector<int64_t>{pb.total_q, pb.nheads, pb.headdim_v}
                : std::vector<int64_t>{pb.batch, pb.seqlen_q, pb.nheads, pb.headdim_v};
  const std::vector<int64_t> lse_shape = pb.varlen
                                             ? std::vector<int64_t>{pb.nheads, pb.total_q}
                                             : std::vector<int64_t>{pb.batch, pb.nheads, pb.seqlen_q};
  check_shape_like(out, "out", o_shape);
  check_shape_like(dout, "dout", o_shape);
  check_shape_like(lse, "softmax_lse", lse_shape);
  FLASHATTN_CHECK(dout.scalar_type() == q.scalar_type(), "dout must have q's dtype (",
                  dtype_name(q.scalar_type()), "), got ", dtype_name(dout.scalar_type()));
  FLASHATTN_CHECK(out.scalar_type() == q.scalar_type(), "out must have q's dtype (",
                  dtype_name(q.scalar_type()), "), got ", dtype_name(out.scalar_type()));
  FLASHATTN_CHECK(lse.scalar_type() == ScalarType::Float, "softmax_lse must be float32, got ",
                  dtype_name(lse.scalar_type()));
  check_same_device(dout, "dout", q);
  check_same_device(out, "out", q);
  check_same_device(lse, "softmax_lse", q);
  check_last_contiguous(out, "out");
  if (dout.size(-1) > 1 && dout.stride(-1) != 1) dout = torch::stable::contiguous(dout);
  if (!lse.is_contiguous()) lse = torch::stable::contiguous(lse);

  Tensor dq = torch::stable::empty(q.sizes(), q.scalar_type(), std::nullopt, q.device());
  Tensor dk = torch::stable::empty(k.sizes(), q.scalar_type(), std::nullopt, q.device());
  Tensor dv = torch::stable::empty(v.sizes(), q.scalar_type(), std::nullopt, q.device());
  // dsink: zeroed, the backend adds into it (params.h); (0,) without a sink.
  Tensor dsink = new_empty({opt.learnable_sink ? pb.nheads : 0}, ScalarType::Float, q);
  if (opt.learnable_sink) torch::stable::zero_(dsink);
  if (pb.total_q == 0 || pb.total_k == 0 || pb.batch == 0 ||
      (!pb.varlen && (pb.seqlen_q == 0 || pb.seqlen_k == 0))) {
    torch::stable::zero_(dq);
    torch::stable::zero_(dk);
    torch::stable::zero_(dv);
    return {dq, dk, dv, dsink};  // no row sees a key: D = 0, so dsink = 0
  }
  Tensor dsum = new_empty(lse_shape, ScalarType::Float, q);
  BwdParams p;
  fill_bwd_params(p, pb, dout, q, k, v, out, lse, dq, dk, dv, dsum,
                  opt.learnable_sink ? &dsink : nullptr, opt, cu_q, cu_k);
  dispatch_bwd(p, q);
  return {dq, dk, dv, dsink};
}

// ---- the ops ----

Tensors2 fwd(Tensor q, Tensor k, Tensor v, double softmax_scale, bool causal, int64_t window_left,
             int64_t window_right, double softcap, std::optional<Tensor> alibi_slopes,
             bool deterministic, double dropout_p, std::optional<Tensor> rng_state,
             std::optional<Tensor> learnable_sink, std::optional<Tensor> kv_num_blocks,
             std::optional<Tensor> kv_indices, std::optional<Tensor> q_num_blocks,
             std::optional<Tensor> q_indices, int64_t block_size_m, int64_t block_size_n) {
  Problem pb = check_qkv(q, k, v, /*varlen=*/false);
  Options opt = with_features(make_options(softmax_scale, causal, window_left, window_right,
                                           softcap, std::move(alibi_slopes), deterministic),
                              dropout_p, std::move(rng_state), std::move(learnable_sink));
  opt = with_block_mask(std::move(opt), std::move(kv_num_blocks), std::move(kv_indices),
                        std::move(q_num_blocks), std::move(q_indices), block_size_m,
                        block_size_n);
  return run_forward(q, k, v, pb, opt, nullptr, nullptr);
}

Tensors4 bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse,
             double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
             double softcap, std::optional<Tensor> alibi_slopes, bool deterministic,
             double dropout_p, std::optional<Tensor> rng_state,
             std::optional<Tensor> learnable_sink, std::optional<Tensor> kv_num_blocks,
             std::optional<Tensor> kv_indices, std::optional<Tensor> q_num_blocks,
             std::optional<Tensor> q_indices, int64_t block_size_m, int64_t block_size_n) {
  Problem pb = check_qkv(q, k, v, /*varlen=*/false);
  Options opt = with_features(make_options(softmax_scale, causal, window_left, window_right,
                                           softcap, std::move(alibi_slopes), deterministic),
                              dropout_p, std::move(rng_state), std::move(learnable_sink));
  opt = with_block_mask(std::move(opt), std::move(kv_num_blocks), std::move(kv_indices),
                        std::move(q_num_blocks), std::move(q_indices), block_size_m,
                        block_size_n);
  return run_backward(dout, q, k, v, out, softmax_lse, pb, opt, nullptr, nullptr);
}

// ---- paged KV (varlen_fwd's block_table) and flash_attn_with_kvcache ----

// block_table: int32 (batch, max_num_blocks_per_seq) on q's device, last dim contiguous; k / v
// (named kn, vn) then hold pages (num_blocks, page_block_size, nheads_k, d / dv). Fills kv's
// paged fields and returns the capacity, max_num_blocks_per_seq * page_block_size.
int64_t check_paged(const Tensor& bt, const Tensor& q, int64_t batch, const Tensor& k,
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
Problem check_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
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

Tensors2 varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                    int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal,
                    int64_t window_left, int64_t window_right, double softcap,
                    std::optional<Tensor> alibi_slopes, bool deterministic,
                    std::optional<Tensor> block_table, double dropout_p,
                    std::optional<Tensor> rng_state, std::optional<Tensor> learnable_sink,
                    std::optional<Tensor> kv_num_blocks, std::optional<Tensor> kv_indices,
                    std::optional<Tensor> q_num_blocks, std::optional<Tensor> q_indices,
                    int64_t block_size_m, int64_t block_size_n) {
  KvCache kv;
  const Tensor* bt = block_table ? &*block_table : nullptr;
  Problem pb = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bt,
                            &kv);
  Options opt = with_features(make_options(softmax_scale, causal, window_left, window_right,
                                           softcap, std::move(alibi_slopes), deterministic),
                              dropout_p, std::move(rng_state), std::move(learnable_sink));
  opt = with_block_mask(std::move(opt), std::move(kv_num_blocks), std::move(kv_indices),
                        std::move(q_num_blocks), std::move(q_indices), block_size_m,
                        block_size_n);
  return run_forward(q, k, v, pb, opt, &cu_seqlens_q, &cu_seqlens_k, bt ? &kv : nullptr);
}

Tensors4 varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse,
                    Tensor cu_seqlens_q, Tensor cu_seqlens_k, int64_t max_seqlen_q,
                    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
                    int64_t window_right, double softcap, std::optional<Tensor> alibi_slopes,
                    bool deterministic, double dropout_p, std::optional<Tensor> rng_state,
                    std::optional<Tensor> learnable_sink, std::optional<Tensor> kv_num_blocks,
                    std::optional<Tensor> kv_indices, std::optional<Tensor> q_num_blocks,
                    std::optional<Tensor> q_indices, int64_t block_size_m,
                    int64_t block_size_n) {
  Problem pb = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  Options opt = with_features(make_options(softmax_scale, causal, window_left, window_right,
                                           softcap, std::move(alibi_slopes), deterministic),
                              dropout_p, std::move(rng_state), std::move(learnable_sink));
  opt = with_block_mask(std::move(opt), std::move(kv_num_blocks), std::move(kv_indices),
                        std::move(q_num_blocks), std::move(q_indices), block_size_m,
                        block_size_n);
  return run_backward(dout, q, k, v, out, softmax_lse, pb, opt, &cu_seqlens_q, &cu_seqlens_k);
}

// q (B, Sq, H, d); k_cache / v_cache (B_cache, Sk, Hk, d / dv), or with block_table the pages
// (num_blocks, page_block_size, Hk, d / dv). pb.seqlen_k is the capacity of a sequence.
Problem check_kvcache(const Tensor& q, const Tensor& kc, const Tensor& vc,
                      const std::optional<Tensor>& block_table, bool has_batch_idx, KvCache& kv) {
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
const Tensor* check_batch_vector(const std::optional<Tensor>& t, const char* name,
                                 const Tensor& q, int64_t batch) {
  if (!t) return nullptr;
  FLASHATTN_CHECK(t->dim() == 1 && t->size(0) == batch, name, " must have shape (batch,) = (",
                  batch, ",), got ", shape_str(*t));
  check_int32_meta(*t, name, q);
  return &*t;
}

// k / v, the rows to append: (batch, seqlen_new, nheads_k, d / dv), like q and the caches.
// Returns seqlen_new (0 without them).
int64_t check_new_kv(const std::optional<Tensor>& k, const std::optional<Tensor>& v,
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
void check_rotary(std::optional<Tensor>& cos, std::optional<Tensor>& sin, const Tensor& q,
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

// The append step's q_rot buffer is q rotated (q's shape, contiguous): the attention reads it.
void read_q_from(FwdParams& p, const Tensor& q_rot) {
  auto s = strides_of(q_rot);
  p.q_ptr = q_rot.data_ptr();
  p.q_batch_stride = s.batch, p.q_row_stride = s.row, p.q_head_stride = s.head;
}

Tensors2 fwd_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, std::optional<Tensor> k,
                     std::optional<Tensor> v, std::optional<Tensor> rotary_cos,
                     std::optional<Tensor> rotary_sin, std::optional<Tensor> cache_seqlens,
                     std::optional<Tensor> cache_batch_idx, std::optional<Tensor> cache_leftpad,
                     std::optional<Tensor> block_table, double softmax_scale, bool causal,
                     int64_t window_left, int64_t window_right, double softcap,
                     bool rotary_interleaved, std::optional<Tensor> alibi_slopes,
                     int64_t num_splits) {
  KvCache kv;
  Problem pb = check_kvcache(q, k_cache, v_cache, block_table, cache_batch_idx.has_value(), kv);
  kv.cache_seqlens = check_batch_vector(cache_seqlens, "cache_seqlens", q, pb.batch);
  kv.cache_batch_idx = check_batch_vector(cache_batch_idx, "cache_batch_idx", q, pb.batch);
  FLASHATTN_CHECK(!(cache_leftpad && block_table), "cache_leftpad cannot be combined with "
                  "block_table (as in flash-attn)");
  kv.cache_leftpad = check_batch_vector(cache_leftpad, "cache_leftpad", q, pb.batch);
  kv.seqlen_knew = check_new_kv(k, v, q, pb, cache_seqlens.has_value());
  check_rotary(rotary_cos, rotary_sin, q, pb, cache_seqlens.has_value());
  FLASHATTN_CHECK(num_splits >= 0 && num_splits < std::numeric_limits<int32_t>::max(),
                  "num_splits must be >= 0 (0: the backend chooses), got ", num_splits);
  kv.num_splits = num_splits;
  Options opt = make_options(softmax_scale, causal, window_left, window_right, softcap,
                             std::move(alibi_slopes), false);
  check_options(opt, pb, q);

  auto [out, lse] = new_outputs(pb, q);
  if (pb.batch == 0) return {out, lse};
  if (pb.total_k == 0 || pb.seqlen_k == 0) return no_keys(out, lse);  // no cache row at all
  FwdParams p;
  fill_fwd_params(p, pb, q, k_cache, v_cache, &out, &lse, opt, nullptr, nullptr);
  fill_kvcache_params(p, kv);
  Tensor q_rot;  // alive until the attention is enqueued
  if (k || rotary_cos) {
    if (rotary_cos)
      q_rot = new_empty({pb.batch, pb.seqlen_q, pb.nheads, pb.headdim}, q.scalar_type(), q);
    KvAppendParams a;
    fill_kvappend_params(a, p, k ? &*k : nullptr, v ? &*v : nullptr,
                         rotary_cos ? &*rotary_cos : nullptr, rotary_sin ? &*rotary_sin : nullptr,
                         rotary_interleaved, rotary_cos ? &q_rot : nullptr);
    dispatch_kvcache_append(p, a, q);
    if (rotary_cos) read_q_from(p, q_rot);
  }
  if (pb.total_q > 0) dispatch_fwd(p, q, /*kvcache=*/true);
  return {out, lse};
}

// The checks of a padded call, or of a varlen one when cu_seqlens_q / cu_seqlens_k are given.
Problem check_either(const Tensor& q, const Tensor& k, const Tensor& v,
                     const std::optional<Tensor>& cu_seqlens_q,
                     const std::optional<Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                     int64_t max_seqlen_k) {
  FLASHATTN_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
                  "cu_seqlens_q and cu_seqlens_k must be given together (varlen) or not at all");
  if (!cu_seqlens_q) return check_qkv(q, k, v, /*varlen=*/false);
  return check_varlen(q, k, v, *cu_seqlens_q, *cu_seqlens_k, max_seqlen_q, max_seqlen_k);
}

// The backend a call would run (the ops' own choice, with the same input checks), as
// flashattn.kernel_path reports it. Runs no kernel and allocates nothing.
std::string kernel_path(std::string direction, Tensor q, Tensor k, Tensor v,
                        std::optional<Tensor> cu_seqlens_q, std::optional<Tensor> cu_seqlens_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                        bool causal, int64_t window_left, int64_t window_right, double softcap,
                        std::optional<Tensor> alibi_slopes, double dropout_p,
                        std::optional<Tensor> learnable_sink) {
  FLASHATTN_CHECK(direction == "fwd" || direction == "bwd",
                  "direction must be 'fwd' or 'bwd', got '", direction, "'");
  const bool varlen = cu_seqlens_q.has_value();
  Problem pb = check_either(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  Options opt = with_features(make_options(softmax_scale, causal, window_left, window_right,
                                           softcap, std::move(alibi_slopes), false),
                              dropout_p, std::nullopt, std::move(learnable_sink));
  check_options(opt, pb, q);
  check_features(opt, pb, q, /*need_rng=*/false);
  if (q.is_cpu()) return backend_name(Backend::kCpu);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  BwdParams p;  // the forward's part filled; as a backward: dout laid out like out, no
                // gradient pointers (a non-deterministic call)
  fill_fwd_params(p, pb, q, k, v, nullptr, nullptr, opt,
                  varlen ? &*cu_seqlens_q : nullptr, varlen ? &*cu_seqlens_k : nullptr);
  if (direction == "fwd") return backend_name(choose_fwd(p));
  p.do_batch_stride = p.o_batch_stride, p.do_row_stride = p.o_row_stride;
  p.do_head_stride = p.o_head_stride;
  return backend_name(choose_bwd(p));
}

// S of params.h for return_attn_probs, from the inputs and softmax_lse of a forward.
Tensor attn_probs(Tensor q, Tensor k, Tensor v, Tensor softmax_lse,
                  std::optional<Tensor> cu_seqlens_q, std::optional<Tensor> cu_seqlens_k,
                  int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal,
                  int64_t window_left, int64_t window_right, double softcap,
                  std::optional<Tensor> alibi_slopes, double dropout_p,
                  std::optional<Tensor> rng_state, std::optional<Tensor> learnable_sink) {
  const bool varlen = cu_seqlens_q.has_value();
  Problem pb = check_either(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  Options opt = with_features(make_options(softmax_scale, causal, window_left, window_right,
                                           softcap, std::move(alibi_slopes), false),
                              dropout_p, std::move(rng_state), std::move(learnable_sink));
  check_options(opt, pb, q);
  check_features(opt, pb, q, /*need_rng=*/true);
  check_shape_like(softmax_lse, "softmax_lse",
                   varlen ? std::vector<int64_t>{pb.nheads, pb.total_q}
                          : std::vector<int64_t>{pb.batch, pb.nheads, pb.seqlen_q});
  FLASHATTN_CHECK(softmax_lse.scalar_type() == ScalarType::Float,
                  "softmax_lse must be float32, got ", dtype_name(softmax_lse.scalar_type()));
  check_same_device(softmax_lse, "softmax_lse", q);
  if (!softmax_lse.is_contiguous()) softmax_lse = torch::stable::contiguous(softmax_lse);
  const auto round128 = [](int64_t x) { return (x + 127) / 128 * 128; };
  const int64_t rows = round128(pb.seqlen_q), cols = round128(pb.seqlen_k);
  Tensor s = new_empty({pb.batch, pb.nheads, rows, cols}, q.scalar_type(), q);
  torch::stable::zero_(s);
  if (pb.batch == 0 || pb.total_q == 0 || pb.total_k == 0) return s;
  FwdParams p;
  fill_fwd_params(p, pb, q, k, v, nullptr, &softmax_lse, opt,
                  varlen ? &*cu_seqlens_q : nullptr, varlen ? &*cu_seqlens_k : nullptr);
  p.s_ptr = s.data_ptr();
  p.s_batch_stride = s.stride(0), p.s_head_stride = s.stride(1), p.s_row_stride = s.stride(2);
  p.s_rows = static_cast<int32_t>(rows), p.s_cols = static_cast<int32_t>(cols);
  if (q.is_cpu()) {
    cpu::run_probs(p, cpu_parallel_for());
    return s;
  }
  check_cuda_has_features(p);
  fail("return_attn_probs=True on CUDA is not built yet (issue 15): the attention "
       "probabilities come from the CPU backend only");
}

}  // namespace
}  // namespace flashattn::api

STABLE_TORCH_LIBRARY(flashattn, m) {
  m.def(flashattn::api::kKernelPathSchema);
  m.def(flashattn::api::kFwdSchema);
  m.def(flashattn::api::kBwdSchema);
  m.def(flashattn::api::kVarlenFwdSchema);
  m.def(flashattn::api::kVarlenBwdSchema);
  m.def(flashattn::api::kFwdKvcacheSchema);
  m.def(flashattn::api::kAttnProbsSchema);
}

STABLE_TORCH_LIBRARY_IMPL(flashattn, CPU, m) {
  m.impl("kernel_path", TORCH_BOX(&flashattn::api::kernel_path));
  m.impl("fwd", TORCH_BOX(&flashattn::api::fwd));
  m.impl("bwd", TORCH_BOX(&flashattn::api::bwd));
  m.impl("varlen_fwd", TORCH_BOX(&flashattn::api::varlen_fwd));
  m.impl("varlen_bwd", TORCH_BOX(&flashattn::api::varlen_bwd));
  m.impl("fwd_kvcache", TORCH_BOX(&flashattn::api::fwd_kvcache));
  m.impl("attn_probs", TORCH_BOX(&flashattn::api::attn_probs));
}

STABLE_TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
  m.impl("kernel_path", TORCH_BOX(&flashattn::api::kernel_path));
  m.impl("fwd", TORCH_BOX(&flashattn::api::fwd));
  m.impl("bwd", TORCH_BOX(&flashattn::api::bwd));
  m.impl("varlen_fwd", TORCH_BOX(&flashattn::api::varlen_fwd));
  m.impl("varlen_bwd", TORCH_BOX(&flashattn::api::varlen_bwd));
  m.impl("fwd_kvcache", TORCH_BOX(&flashattn::api::fwd_kvcache));
  m.impl("attn_probs", TORCH_BOX(&flashattn::api::attn_probs));
}
