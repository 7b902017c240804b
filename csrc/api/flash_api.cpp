// The ops torch.ops.flashattn.{fwd,bwd,varlen_fwd,varlen_bwd,fwd_kvcache,attn_probs}: input
// checks (input_checks.h), output allocation through torch, params filling, dispatch to a
// backend. Stable ABI only.
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
#include "input_checks.h"
#include "params_fill.h"
#include "schema.h"

#ifdef FLASHATTN_SPLIT_CUDA
#include "cuda_forward.h"  // the split build: the stream through flashattn._C_cuda's table
#else
extern "C" {
// From torch's C shim (a C symbol, stable across versions); declared here so this file
// does not need USE_CUDA while including the shim.
int32_t aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);
}
#endif

namespace flashattn::api {
namespace {

using torch::stable::Tensor;
using Tensors2 = std::tuple<Tensor, Tensor>;
using Tensors3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensors4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;

Tensor new_empty(const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like) {
  return torch::stable::empty(shape, dtype, std::nullopt, like.device());
}

cpu::ParallelFor cpu_parallel_for() {
  return [](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    torch::stable::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { fn(b, e); });
  };
}

[[maybe_unused]] void* current_stream(const Tensor& q) {
#ifdef FLASHATTN_SPLIT_CUDA
  return cuda_current_stream(q.get_device_index());
#else
  void* stream = nullptr;
  FLASHATTN_CHECK(aoti_torch_get_current_cuda_stream(q.get_device_index(), &stream) == 0,
                  "could not get the current CUDA stream");
  return stream;
#endif
}

// The backend's workspace, zeroed unless `zeroed` is false, through torch's allocator (kept
// alive by the caller until the backend's work is enqueued; the caching allocator orders
// reuse on the stream). A part of no elements is not allocated (its pointer stays null): the
// decode path of most calls asks for none.
using Workspace = std::pair<std::optional<Tensor>, std::optional<Tensor>>;
Workspace alloc_workspace(FwdParams& p, const WorkspaceSizes& ws, const Tensor& q,
                          bool zeroed = true) {
  Workspace w;
  if (ws.f32_elems > 0) {
    w.first = new_empty({ws.f32_elems}, ScalarType::Float, q);
    if (zeroed) torch::stable::zero_(*w.first);
    p.workspace_f32 = static_cast<float*>(w.first->data_ptr());
  }
  if (ws.i32_elems > 0) {
    w.second = new_empty({ws.i32_elems}, ScalarType::Int, q);
    if (zeroed) torch::stable::zero_(*w.second);
    p.workspace_i32 = static_cast<int32_t*>(w.second->data_ptr());
  }
  p.workspace_f32_elems = ws.f32_elems;
  p.workspace_i32_elems = ws.i32_elems;
  return w;
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
    case Backend::kSm90: {  // FP8 calls: the staged inputs (varlen: zeroed, their gaps read)
      auto ws = alloc_workspace(p, sm90::fwd_workspace(p), q, /*zeroed=*/p.is_varlen);
      return sm90::run_fwd(p, current_stream(q));
    }
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

// The options of fwd / bwd / varlen_fwd / varlen_bwd (their schemas' shared arguments).
Options op_options(double scale, bool causal, int64_t wl, int64_t wr, double softcap,
                   std::optional<Tensor> alibi, bool deterministic, double dropout_p,
                   std::optional<Tensor> rng_state, std::optional<Tensor> learnable_sink,
                   std::optional<Tensor> kv_num_blocks, std::optional<Tensor> kv_indices,
                   std::optional<Tensor> q_num_blocks, std::optional<Tensor> q_indices,
                   int64_t block_m, int64_t block_n,
                   std::optional<Tensor> q_descale = std::nullopt,
                   std::optional<Tensor> k_descale = std::nullopt,
                   std::optional<Tensor> v_descale = std::nullopt,
                   std::optional<ScalarType> out_dtype = std::nullopt,
                   std::optional<Tensor> q_pos_offset = std::nullopt,
                   std::optional<Tensor> k_pos_offset = std::nullopt) {
  Options opt = with_features(
      make_options(scale, causal, wl, wr, softcap, std::move(alibi), deterministic), dropout_p,
      std::move(rng_state), std::move(learnable_sink));
  opt.kv_num_blocks = std::move(kv_num_blocks);
  opt.kv_indices = std::move(kv_indices);
  opt.q_num_blocks = std::move(q_num_blocks);
  opt.q_indices = std::move(q_indices);
  opt.block_m = block_m;
  opt.block_n = block_n;
  opt.q_descale = std::move(q_descale);
  opt.k_descale = std::move(k_descale);
  opt.v_descale = std::move(v_descale);
  opt.out_dtype = out_dtype;
  opt.q_pos_offset = std::move(q_pos_offset);
  opt.k_pos_offset = std::move(k_pos_offset);
  return opt;
}

// Fresh outputs: out (B, Sq, H, dv) / (total_q, H, dv) in `dtype` (q's; FP8: out_dtype), lse
// (B, H, Sq) / (H, total_q).
Tensors2 new_outputs(const Problem& pb, const Tensor& q, ScalarType dtype) {
  Tensor out = pb.varlen ? new_empty({pb.total_q, pb.nheads, pb.headdim_v}, dtype, q)
                         : new_empty({pb.batch, pb.seqlen_q, pb.nheads, pb.headdim_v}, dtype, q);
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
  check_fp8(opt, pb, q, /*paged=*/kv != nullptr);
  check_features(opt, pb, q, /*need_rng=*/true);
  check_block_sparse(opt, pb, q, /*backward=*/false, /*paged=*/kv != nullptr);
  check_pos_offsets(opt, pb, q);
  auto [out, lse] = new_outputs(pb, q, out_scalar_type(opt, q));
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
  FLASHATTN_CHECK(!is_fp8(q), kFp8ForwardOnly);
  check_options(opt, pb, q);
  check_features(opt, pb, q, /*need_rng=*/true);
  check_block_sparse(opt, pb, q, /*backward=*/true, /*paged=*/false);
  check_pos_offsets(opt, pb, q);
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
             std::optional<Tensor> q_indices, int64_t block_size_m, int64_t block_size_n,
             std::optional<Tensor> q_descale, std::optional<Tensor> k_descale,
             std::optional<Tensor> v_descale, std::optional<ScalarType> out_dtype,
             std::optional<Tensor> q_pos_offset, std::optional<Tensor> k_pos_offset) {
  Problem pb = check_qkv(q, k, v, /*varlen=*/false);
  Options opt = op_options(softmax_scale, causal, window_left, window_right, softcap,
                           std::move(alibi_slopes), deterministic, dropout_p,
                           std::move(rng_state), std::move(learnable_sink),
                           std::move(kv_num_blocks), std::move(kv_indices),
                           std::move(q_num_blocks), std::move(q_indices), block_size_m,
                           block_size_n, std::move(q_descale), std::move(k_descale),
                           std::move(v_descale), out_dtype, std::move(q_pos_offset),
                           std::move(k_pos_offset));
  return run_forward(q, k, v, pb, opt, nullptr, nullptr);
}

Tensors4 bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse,
             double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
             double softcap, std::optional<Tensor> alibi_slopes, bool deterministic,
             double dropout_p, std::optional<Tensor> rng_state,
             std::optional<Tensor> learnable_sink, std::optional<Tensor> kv_num_blocks,
             std::optional<Tensor> kv_indices, std::optional<Tensor> q_num_blocks,
             std::optional<Tensor> q_indices, int64_t block_size_m, int64_t block_size_n,
             std::optional<Tensor> q_pos_offset, std::optional<Tensor> k_pos_offset) {
  Problem pb = check_qkv(q, k, v, /*varlen=*/false);
  Options opt = op_options(softmax_scale, causal, window_left, window_right, softcap,
                           std::move(alibi_slopes), deterministic, dropout_p,
                           std::move(rng_state), std::move(learnable_sink),
                           std::move(kv_num_blocks), std::move(kv_indices),
                           std::move(q_num_blocks), std::move(q_indices), block_size_m,
                           block_size_n, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                           std::move(q_pos_offset), std::move(k_pos_offset));
  return run_backward(dout, q, k, v, out, softmax_lse, pb, opt, nullptr, nullptr);
}

// ---- paged KV (varlen_fwd's block_table) and flash_attn_with_kvcache ----

Tensors2 varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                    int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal,
                    int64_t window_left, int64_t window_right, double softcap,
                    std::optional<Tensor> alibi_slopes, bool deterministic,
                    std::optional<Tensor> block_table, double dropout_p,
                    std::optional<Tensor> rng_state, std::optional<Tensor> learnable_sink,
                    std::optional<Tensor> kv_num_blocks, std::optional<Tensor> kv_indices,
                    std::optional<Tensor> q_num_blocks, std::optional<Tensor> q_indices,
                    int64_t block_size_m, int64_t block_size_n,
                    std::optional<Tensor> q_descale, std::optional<Tensor> k_descale,
                    std::optional<Tensor> v_descale, std::optional<ScalarType> out_dtype,
                    std::optional<Tensor> q_pos_offset, std::optional<Tensor> k_pos_offset) {
  KvCache kv;
  const Tensor* bt = block_table ? &*block_table : nullptr;
  Problem pb = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bt,
                            &kv);
  Options opt = op_options(softmax_scale, causal, window_left, window_right, softcap,
                           std::move(alibi_slopes), deterministic, dropout_p,
                           std::move(rng_state), std::move(learnable_sink),
                           std::move(kv_num_blocks), std::move(kv_indices),
                           std::move(q_num_blocks), std::move(q_indices), block_size_m,
                           block_size_n, std::move(q_descale), std::move(k_descale),
                           std::move(v_descale), out_dtype, std::move(q_pos_offset),
                           std::move(k_pos_offset));
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
                    int64_t block_size_n, std::optional<Tensor> q_pos_offset,
                    std::optional<Tensor> k_pos_offset) {
  Problem pb = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  Options opt = op_options(softmax_scale, causal, window_left, window_right, softcap,
                           std::move(alibi_slopes), deterministic, dropout_p,
                           std::move(rng_state), std::move(learnable_sink),
                           std::move(kv_num_blocks), std::move(kv_indices),
                           std::move(q_num_blocks), std::move(q_indices), block_size_m,
                           block_size_n, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                           std::move(q_pos_offset), std::move(k_pos_offset));
  return run_backward(dout, q, k, v, out, softmax_lse, pb, opt, &cu_seqlens_q, &cu_seqlens_k);
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
  FLASHATTN_CHECK(!is_fp8(q), "flash_attn_with_kvcache does not take float8_e4m3fn inputs (FP8 "
                  "attention, issue 14, is flash_attn_func / flash_attn_varlen_func's)");
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

  auto [out, lse] = new_outputs(pb, q, q.scalar_type());
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

// The backend a call would run (the ops' own choice, with the same input checks), as
// flashattn.kernel_path reports it. Runs no kernel and allocates nothing.
std::string kernel_path(std::string direction, Tensor q, Tensor k, Tensor v,
                        std::optional<Tensor> cu_seqlens_q, std::optional<Tensor> cu_seqlens_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                        bool causal, int64_t window_left, int64_t window_right, double softcap,
                        std::optional<Tensor> alibi_slopes, double dropout_p,
                        std::optional<Tensor> learnable_sink,
                        std::optional<Tensor> kv_num_blocks, std::optional<Tensor> kv_indices,
                        std::optional<Tensor> q_num_blocks, std::optional<Tensor> q_indices,
                        int64_t block_size_m, int64_t block_size_n) {
  FLASHATTN_CHECK(direction == "fwd" || direction == "bwd",
                  "direction must be 'fwd' or 'bwd', got '", direction, "'");
  const bool varlen = cu_seqlens_q.has_value();
  Problem pb = check_either(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  Options opt = op_options(softmax_scale, causal, window_left, window_right, softcap,
                           std::move(alibi_slopes), false, dropout_p, std::nullopt,
                           std::move(learnable_sink), std::move(kv_num_blocks),
                           std::move(kv_indices), std::move(q_num_blocks), std::move(q_indices),
                           block_size_m, block_size_n);
  check_options(opt, pb, q);
  FLASHATTN_CHECK(!is_fp8(q) || direction == "fwd", kFp8ForwardOnly);
  check_fp8(opt, pb, q, /*paged=*/false);
  check_features(opt, pb, q, /*need_rng=*/false);
  check_block_sparse(opt, pb, q, /*backward=*/direction == "bwd", /*paged=*/false);
  if (q.is_cpu()) return backend_name(Backend::kCpu);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  BwdParams p;  // the forward's part filled; as a backward: dout laid out like out, no
                // gradient pointers (a non-deterministic call)
  fill_fwd_params(p, pb, q, k, v, nullptr, nullptr, opt,
                  varlen ? &*cu_seqlens_q : nullptr, varlen ? &*cu_seqlens_k : nullptr);
  if (direction == "fwd") return backend_name(choose_fwd(p));
  p.do_batch_stride = p.o_batch_stride, p.do_row_stride = p.o_row_stride;
  p.do_head_stride = p.o_head_stride;
  fill_bwd_block_mask(p, opt);
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
  FLASHATTN_CHECK(!is_fp8(q), "attn_probs (return_attn_probs' S) does not take float8_e4m3fn "
                  "inputs (FP8 attention, issue 14, has no dropout and so no S)");
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
#ifndef FLASHATTN_DISABLE_SM80
  sm80_or_fail("return_attn_probs");
  sm80::run_attn_probs(p, current_stream(q));
  return s;
#else
  fail("return_attn_probs=True on CUDA tensors needs the portable (sm80) kernels, which this "
       "build does not have");
#endif
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
