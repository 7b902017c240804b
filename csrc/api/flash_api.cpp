// The ops torch.ops.flashattn.{fwd,bwd,varlen_fwd,varlen_bwd}: input checks, output
// allocation through torch, params filling, dispatch to a backend. Stable ABI only.
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

// Validates q, k, v and returns the problem sizes. Padded: (B, S, H, d); varlen: (total, H, d).
Problem check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, bool varlen) {
  const char* layout = varlen ? "(total_tokens, nheads, headdim)" : "(batch, seqlen, nheads, headdim)";
  const int64_t nd = varlen ? 3 : 4;
  check_dim(q, "q", nd, layout);
  check_dim(k, "k", nd, layout);
  check_dim(v, "v", nd, layout);
  const ScalarType t = q.scalar_type();
  FLASHATTN_CHECK(t == ScalarType::Half || t == ScalarType::BFloat16 ||
                      (t == ScalarType::Float && q.is_cpu()),
                  "q must have dtype float16 or bfloat16", q.is_cpu() ? " or float32" : "",
                  " (float32 runs on CPU only), got ", dtype_name(t));
  FLASHATTN_CHECK(k.scalar_type() == t, "k must have the same dtype as q (", dtype_name(t),
                  "), got ", dtype_name(k.scalar_type()));
  FLASHATTN_CHECK(v.scalar_type() == t, "v must have the same dtype as q (", dtype_name(t),
                  "), got ", dtype_name(v.scalar_type()));
  FLASHATTN_CHECK(q.is_cpu() || q.is_cuda(), "q must be a CPU or CUDA tensor");
  check_same_device(k, "k", q);
  check_same_device(v, "v", q);
  check_last_contiguous(q, "q");
  check_last_contiguous(k, "k");
  check_last_contiguous(v, "v");

  Problem pb;
  pb.varlen = varlen;
  const int64_t o = varlen ? 1 : 2;  // index of the heads dimension
  pb.nheads = q.size(o);
  pb.nheads_k = k.size(o);
  pb.headdim = q.size(o + 1);
  pb.headdim_v = v.size(o + 1);
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
  check_size(v, "v", o, pb.nheads_k, "nheads (must equal k's)");
  check_size(k, "k", o + 1, pb.headdim, "headdim (must equal q's)");
  FLASHATTN_CHECK(pb.headdim >= 1 && pb.headdim <= kMaxHeadDim,
                  "q headdim must be between 1 and ", kMaxHeadDim, ", got ", pb.headdim);
  FLASHATTN_CHECK(pb.headdim_v >= 1 && pb.headdim_v <= kMaxHeadDim,
                  "v headdim must be between 1 and ", kMaxHeadDim, ", got ", pb.headdim_v);
  FLASHATTN_CHECK(pb.nheads_k >= 1 && pb.nheads >= 1, "q and k must have at least one head, got ",
                  pb.nheads, " and ", pb.nheads_k);
  FLASHATTN_CHECK(pb.nheads < std::numeric_limits<int32_t>::max(), "q has too many heads (",
                  pb.nheads, ")");
  FLASHATTN_CHECK(pb.nheads % pb.nheads_k == 0, "nheads of q (", pb.nheads,
                  ") must be divisible by nheads of k and v (", pb.nheads_k, ")");
  FLASHATTN_CHECK(pb.total_q < std::numeric_limits<int32_t>::max() &&
                      pb.total_k < std::numeric_limits<int32_t>::max(),
                  "too many tokens: q and k must have fewer than 2^31 rows");
  return pb;
}

void check_cu_seqlens(const Tensor& cu, const char* name, const Tensor& q, int64_t batch) {
  FLASHATTN_CHECK(cu.scalar_type() == ScalarType::Int, name, " must have dtype int32, got ",
                  dtype_name(cu.scalar_type()));
  FLASHATTN_CHECK(cu.dim() == 1 && cu.size(0) >= 1, name,
                  " must be 1-D with batch + 1 entries, got shape ", shape_str(cu));
  FLASHATTN_CHECK(batch < 0 || cu.size(0) == batch + 1, name, " must have batch + 1 = ", batch + 1,
                  " entries (like cu_seqlens_q), got ", cu.size(0));
  check_same_device(cu, name, q);
  FLASHATTN_CHECK(cu.is_contiguous(), name, " must be contiguous");
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

void dispatch_fwd(const FwdParams& p, const Tensor& q) {
  if (q.is_cpu()) return cpu::run_fwd(p, cpu_parallel_for());
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  switch (choose_fwd(p)) {
#ifndef FLASHATTN_DISABLE_SM90
    case Backend::kSm90: return sm90::run_fwd(p, current_stream(q));
#endif
#ifndef FLASHATTN_DISABLE_SM80
    case Backend::kSm80:
    case Backend::kSm80Ptx: return sm80::run_fwd(p, current_stream(q));
#endif
    default: fail("the forward: no kernel of this build runs the chosen backend");
  }
}

// The backend's workspace, zeroed, through torch's allocator (kept alive by the caller
// until the backend's work is enqueued; the caching allocator orders reuse on the stream).
std::pair<Tensor, Tensor> alloc_workspace(BwdParams& p, const BwdWorkspaceSizes& ws,
                                          const Tensor& q) {
  Tensor f32 = new_empty({ws.f32_elems}, ScalarType::Float, q);
  Tensor i32 = new_empty({ws.i32_elems}, ScalarType::Int, q);
  torch::stable::zero_(f32);
  torch::stable::zero_(i32);
  p.workspace_f32 = static_cast<float*>(f32.data_ptr());
  p.workspace_f32_elems = ws.f32_elems;
  p.workspace_i32 = static_cast<int32_t*>(i32.data_ptr());
  p.workspace_i32_elems = ws.i32_elems;
  return {f32, i32};
}

void dispatch_bwd(BwdParams& p, const Tensor& q) {
  if (q.is_cpu()) {
    auto ws = alloc_workspace(p, cpu::bwd_workspace(p), q);
    return cpu::run_bwd(p, cpu_parallel_for());
  }
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const Backend backend = choose_bwd();
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

Tensors2 run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Problem& pb,
                     const Options& opt, const Tensor* cu_q, const Tensor* cu_k) {
  check_options(opt, pb, q);
  Tensor out = pb.varlen ? new_empty({pb.total_q, pb.nheads, pb.headdim_v}, q.scalar_type(), q)
                         : new_empty({pb.batch, pb.seqlen_q, pb.nheads, pb.headdim_v},
                                     q.scalar_type(), q);
  Tensor lse = pb.varlen ? new_empty({pb.nheads, pb.total_q}, ScalarType::Float, q)
                         : new_empty({pb.batch, pb.nheads, pb.seqlen_q}, ScalarType::Float, q);
  if (pb.total_q == 0) return {out, lse};
  if ((!pb.varlen && pb.seqlen_k == 0) || (pb.varlen && pb.batch == 0)) {  // no visible key
    torch::stable::zero_(out);
    torch::stable::fill_(lse, -std::numeric_limits<double>::infinity());
    return {out, lse};
  }
  FwdParams p;
  fill_fwd_params(p, pb, q, k, v, &out, &lse, opt, cu_q, cu_k);
  dispatch_fwd(p, q);
  return {out, lse};
}

Tensors3 run_backward(Tensor dout, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out, Tensor lse, const Problem& pb, const Options& opt,
                      const Tensor* cu_q, const Tensor* cu_k) {
  check_options(opt, pb, q);
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
  if (pb.total_q == 0 || pb.total_k == 0 || pb.batch == 0 ||
      (!pb.varlen && (pb.seqlen_q == 0 || pb.seqlen_k == 0))) {
    torch::stable::zero_(dq);
    torch::stable::zero_(dk);
    torch::stable::zero_(dv);
    return {dq, dk, dv};
  }
  Tensor dsum = new_empty(lse_shape, ScalarType::Float, q);
  BwdParams p;
  fill_bwd_params(p, pb, dout, q, k, v, out, lse, dq, dk, dv, dsum, opt, cu_q, cu_k);
  dispatch_bwd(p, q);
  return {dq, dk, dv};
}

// ---- the four ops ----

Tensors2 fwd(Tensor q, Tensor k, Tensor v, double softmax_scale, bool causal, int64_t window_left,
             int64_t window_right, double softcap, std::optional<Tensor> alibi_slopes,
             bool deterministic) {
  Problem pb = check_qkv(q, k, v, /*varlen=*/false);
  Options opt = make_options(softmax_scale, causal, window_left, window_right, softcap,
                             std::move(alibi_slopes), deterministic);
  return run_forward(q, k, v, pb, opt, nullptr, nullptr);
}

Tensors3 bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse,
             double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
             double softcap, std::optional<Tensor> alibi_slopes, bool deterministic) {
  Problem pb = check_qkv(q, k, v, /*varlen=*/false);
  Options opt = make_options(softmax_scale, causal, window_left, window_right, softcap,
                             std::move(alibi_slopes), deterministic);
  return run_backward(dout, q, k, v, out, softmax_lse, pb, opt, nullptr, nullptr);
}

Problem check_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                     const Tensor& cu_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  Problem pb = check_qkv(q, k, v, /*varlen=*/true);
  check_cu_seqlens(cu_q, "cu_seqlens_q", q, -1);
  check_cu_seqlens(cu_k, "cu_seqlens_k", q, cu_q.size(0) - 1);
  check_max_seqlen(max_seqlen_q, "max_seqlen_q");
  check_max_seqlen(max_seqlen_k, "max_seqlen_k");
  pb.batch = cu_q.size(0) - 1;
  // No sequence is longer than its tensor: clamping the hints keeps grid and workspace
  // sizes in 32-bit range whatever the caller passes.
  pb.seqlen_q = std::min(max_seqlen_q, pb.total_q);
  pb.seqlen_k = std::min(max_seqlen_k, pb.total_k);
  return pb;
}

Tensors2 varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                    int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal,
                    int64_t window_left, int64_t window_right, double softcap,
                    std::optional<Tensor> alibi_slopes, bool deterministic) {
  Problem pb = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  Options opt = make_options(softmax_scale, causal, window_left, window_right, softcap,
                             std::move(alibi_slopes), deterministic);
  return run_forward(q, k, v, pb, opt, &cu_seqlens_q, &cu_seqlens_k);
}

Tensors3 varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse,
                    Tensor cu_seqlens_q, Tensor cu_seqlens_k, int64_t max_seqlen_q,
                    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
                    int64_t window_right, double softcap, std::optional<Tensor> alibi_slopes,
                    bool deterministic) {
  Problem pb = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  Options opt = make_options(softmax_scale, causal, window_left, window_right, softcap,
                             std::move(alibi_slopes), deterministic);
  return run_backward(dout, q, k, v, out, softmax_lse, pb, opt, &cu_seqlens_q, &cu_seqlens_k);
}

// The backend a call would run (the ops' own choice, with the same input checks), as
// flashattn.kernel_path reports it. Runs no kernel and allocates nothing.
std::string kernel_path(std::string direction, Tensor q, Tensor k, Tensor v,
                        std::optional<Tensor> cu_seqlens_q, std::optional<Tensor> cu_seqlens_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                        bool causal, int64_t window_left, int64_t window_right, double softcap,
                        std::optional<Tensor> alibi_slopes) {
  FLASHATTN_CHECK(direction == "fwd" || direction == "bwd",
                  "direction must be 'fwd' or 'bwd', got '", direction, "'");
  FLASHATTN_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
                  "cu_seqlens_q and cu_seqlens_k must be given together (varlen) or not at all");
  const bool varlen = cu_seqlens_q.has_value();
  Problem pb = varlen ? check_varlen(q, k, v, *cu_seqlens_q, *cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k)
                      : check_qkv(q, k, v, /*varlen=*/false);
  Options opt = make_options(softmax_scale, causal, window_left, window_right, softcap,
                             std::move(alibi_slopes), false);
  check_options(opt, pb, q);
  if (q.is_cpu()) return backend_name(Backend::kCpu);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  if (direction == "bwd") return backend_name(choose_bwd());
  FwdParams p;
  fill_fwd_params(p, pb, q, k, v, nullptr, nullptr, opt,
                  varlen ? &*cu_seqlens_q : nullptr, varlen ? &*cu_seqlens_k : nullptr);
  return backend_name(choose_fwd(p));
}

}  // namespace
}  // namespace flashattn::api

STABLE_TORCH_LIBRARY(flashattn, m) {
  m.def(flashattn::api::kKernelPathSchema);
  m.def(flashattn::api::kFwdSchema);
  m.def(flashattn::api::kBwdSchema);
  m.def(flashattn::api::kVarlenFwdSchema);
  m.def(flashattn::api::kVarlenBwdSchema);
}

STABLE_TORCH_LIBRARY_IMPL(flashattn, CPU, m) {
  m.impl("kernel_path", TORCH_BOX(&flashattn::api::kernel_path));
  m.impl("fwd", TORCH_BOX(&flashattn::api::fwd));
  m.impl("bwd", TORCH_BOX(&flashattn::api::bwd));
  m.impl("varlen_fwd", TORCH_BOX(&flashattn::api::varlen_fwd));
  m.impl("varlen_bwd", TORCH_BOX(&flashattn::api::varlen_bwd));
}

STABLE_TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
  m.impl("kernel_path", TORCH_BOX(&flashattn::api::kernel_path));
  m.impl("fwd", TORCH_BOX(&flashattn::api::fwd));
  m.impl("bwd", TORCH_BOX(&flashattn::api::bwd));
  m.impl("varlen_fwd", TORCH_BOX(&flashattn::api::varlen_fwd));
  m.impl("varlen_bwd", TORCH_BOX(&flashattn::api::varlen_bwd));
}
