// One attention problem for the standalone self-tests (no torch, no CUDA): its sizes, the
// FwdParams / BwdParams the package would pass for it (csrc/api/params_fill.h mirrored, the
// window rule included) and the float64 CPU reference of params.h's score semantics.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#include "common/params.h"

namespace flashattn::selftest {

// Sizes as params_fill.h's Problem sees them, with every sequence's lengths. Padded: `batch`
// sequences of seqlen_q / seqlen_k rows, sequence b at row b * seqlen. Varlen: packed rows,
// sequence b at cu_seqlens[b] (lengths may be 0).
struct Sizes {
  bool varlen = false;
  int batch = 0, nheads = 0, nheads_k = 0, headdim = 0, headdim_v = 0;
  std::vector<int> lq, lk;          // per sequence
  std::vector<int32_t> cu_q, cu_k;  // first row of each sequence, then the row count

  static Sizes padded(int batch, int seqlen_q, int seqlen_k, int nheads, int nheads_k,
                      int headdim, int headdim_v) {
    return make(false, std::vector<int>(batch, seqlen_q), std::vector<int>(batch, seqlen_k),
                nheads, nheads_k, headdim, headdim_v);
  }
  static Sizes packed(std::vector<int> lq, std::vector<int> lk, int nheads, int nheads_k,
                      int headdim, int headdim_v) {
    return make(true, std::move(lq), std::move(lk), nheads, nheads_k, headdim, headdim_v);
  }
  // The params' seqlen_q / seqlen_k: max_seqlen for varlen.
  int seqlen_q() const { return lq.empty() ? 0 : *std::max_element(lq.begin(), lq.end()); }
  int seqlen_k() const { return lk.empty() ? 0 : *std::max_element(lk.begin(), lk.end()); }
  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }

 private:
  static Sizes make(bool varlen, std::vector<int> lq, std::vector<int> lk, int nheads,
                    int nheads_k, int headdim, int headdim_v) {
    if (lq.size() != lk.size()) throw std::invalid_argument("Sizes: lq and lk differ in batch");
    Sizes s;
    s.varlen = varlen;
    s.batch = static_cast<int>(lq.size());
    s.nheads = nheads, s.nheads_k = nheads_k, s.headdim = headdim, s.headdim_v = headdim_v;
    s.lq = std::move(lq), s.lk = std::move(lk);
    s.cu_q.assign(s.batch + 1, 0), s.cu_k.assign(s.batch + 1, 0);
    for (int b = 0; b < s.batch; ++b) {
      s.cu_q[b + 1] = s.cu_q[b] + s.lq[b];
      s.cu_k[b + 1] = s.cu_k[b] + s.lk[b];
    }
    return s;
  }
};

// The API's options (params_fill.h's Options; alibi slopes as a device pointer).
struct Options {
  DType dtype = DType::kBFloat16;
  std::optional<double> softmax_scale;  // unset: 1 / sqrt(headdim), the API's default
  bool causal = false;
  int window_left = -1, window_right = -1;
  double softcap = 0.0;
  const float* alibi_slopes = nullptr;  // fp32, (batch, nheads) or (nheads,)
  int64_t alibi_batch_stride = 0;       // nheads for (batch, nheads) slopes, else 0
  bool deterministic = false;
};

// A device tensor (rows, heads, ld) as strides_of() reads it: row stride heads * ld, head
// stride ld, batch stride (padded) seqlen * heads * ld. ld 0: the head dim (contiguous).
struct DevTensor {
  void* ptr = nullptr;
  int64_t ld = 0;
};
struct FwdTensors {
  DevTensor q, k, v, out;
  float* lse = nullptr;  // contiguous: padded (batch, nheads, seqlen_q), varlen (nheads, total_q)
  const int32_t* cu_seqlens_q = nullptr;  // device, varlen only
  const int32_t* cu_seqlens_k = nullptr;
};
struct BwdTensors : FwdTensors {
  DevTensor dout, dq, dk, dv;
  float* dsoftmax_sum = nullptr;  // laid out like lse
};

namespace detail {
inline void set_strides(const DevTensor& t, int dim, int heads, int seqlen, bool varlen,
                        int64_t& batch, int64_t& row, int64_t& head) {
  const int64_t ld = t.ld > 0 ? t.ld : dim;
  head = ld;
  row = heads * ld;
  batch = varlen ? 0 : seqlen * row;
}
}  // namespace detail

// fill_fwd_params of csrc/api/params_fill.h for these sizes and device pointers.
inline FwdParams fwd_params(const Sizes& s, const FwdTensors& t, const Options& opt) {
  using detail::set_strides;
  FwdParams p;
  const bool vl = s.varlen;
  const int sq = s.seqlen_q(), sk = s.seqlen_k();
  p.q_ptr = t.q.ptr;
  p.k_ptr = t.k.ptr;
  p.v_ptr = t.v.ptr;
  p.o_ptr = t.out.ptr;
  p.lse_ptr = t.lse;
  set_strides(t.q, s.headdim, s.nheads, sq, vl, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  set_strides(t.k, s.headdim, s.nheads_k, sk, vl, p.k_batch_stride, p.k_row_stride,
              p.k_head_stride);
  set_strides(t.v, s.headdim_v, s.nheads_k, sk, vl, p.v_batch_stride, p.v_row_stride,
              p.v_head_stride);
  set_strides(t.out, s.headdim_v, s.nheads, sq, vl, p.o_batch_stride, p.o_row_stride,
              p.o_head_stride);
  p.lse_batch_stride = vl ? 0 : int64_t(s.nheads) * sq;
  p.lse_head_stride = vl ? s.total_q() : sq;

  p.batch = s.batch;
  p.nheads = s.nheads;
  p.nheads_k = s.nheads_k;
  p.headdim = s.headdim;
  p.headdim_v = s.headdim_v;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.total_q = s.total_q();
  p.total_k = s.total_k();
  p.is_varlen = vl;
  p.cu_seqlens_q = t.cu_seqlens_q;
  p.cu_seqlens_k = t.cu_seqlens_k;

  const double scale = opt.softmax_scale.value_or(1.0 / std::sqrt(double(s.headdim)));
  p.dtype = opt.dtype;
  p.softmax_scale = static_cast<float>(scale);
  p.softmax_scale_log2 = static_cast<float>(scale * M_LOG2E);
  p.softcap = static_cast<float>(opt.softcap);
  // params_fill's window rule: causal is window_right = 0; a side >= seqlen_k (max_seqlen_k
  // for varlen) is unbounded.
  int64_t wl = opt.window_left, wr = opt.causal ? 0 : opt.window_right;
  if (wl >= sk) wl = -1;
  if (!opt.causal && wr >= sk) wr = -1;
  p.window_left = static_cast<int32_t>(wl);
  p.window_right = static_cast<int32_t>(wr);
  if (opt.alibi_slopes != nullptr) {
    p.alibi_slopes = opt.alibi_slopes;
    p.alibi_batch_stride = opt.alibi_batch_stride;
  }
  return p;
}

// fill_bwd_params of csrc/api/params_fill.h; the workspace stays the caller's to set.
inline BwdParams bwd_params(const Sizes& s, const BwdTensors& t, const Options& opt) {
  using detail::set_strides;
  BwdParams p;
  static_cast<FwdParams&>(p) = fwd_params(s, t, opt);
  const bool vl = s.varlen;
  const int sq = s.seqlen_q(), sk = s.seqlen_k();
  p.do_ptr = t.dout.ptr;
  set_strides(t.dout, s.headdim_v, s.nheads, sq, vl, p.do_batch_stride, p.do_row_stride,
              p.do_head_stride);
  p.dq_ptr = t.dq.ptr;
  set_strides(t.dq, s.headdim, s.nheads, sq, vl, p.dq_batch_stride, p.dq_row_stride,
              p.dq_head_stride);
  p.dk_ptr = t.dk.ptr;
  set_strides(t.dk, s.headdim, s.nheads_k, sk, vl, p.dk_batch_stride, p.dk_row_stride,
              p.dk_head_stride);
  p.dv_ptr = t.dv.ptr;
  set_strides(t.dv, s.headdim_v, s.nheads_k, sk, vl, p.dv_batch_stride, p.dv_row_stride,
              p.dv_head_stride);
  p.dsoftmax_sum = t.dsoftmax_sum;
  p.deterministic = opt.deterministic;
  return p;
}

// Where row i of sequence b, head h sits in lse (and dsoftmax_sum).
inline int64_t lse_offset(const FwdParams& p, const Sizes& s, int b, int h, int i) {
  return b * p.lse_batch_stride + h * p.lse_head_stride + (s.varlen ? s.cu_q[b] : 0) + i;
}

// Host inputs as float, already rounded to the kernel's 16-bit type, contiguous (rows, heads,
// dim) over the rows of Sizes: q (total_q, nheads, headdim), k (total_k, nheads_k, headdim),
// v (total_k, nheads_k, headdim_v), dout (total_q, nheads, headdim_v; backward only).
// alibi_slopes: the host copy of the options' slopes (empty: none).
struct HostInputs {
  std::vector<float> q, k, v, dout, alibi_slopes;
};

struct Reference {
  std::vector<double> out;         // like q's rows: (total_q, nheads, headdim_v)
  std::vector<double> lse;         // at lse_offset(); -inf for a row with no visible key
  std::vector<double> dq, dk, dv;  // backward only, shaped like q, k, v
};

// Attention in float64 the obvious way, with the options the kernel gets (p: the scale as
// float, softcap, the windows after the rule, the ALiBi stride), per params.h:
//   s = q.k * scale; softcap * tanh(s / softcap); - slope * |i + sk - sq - j|; window mask.
// backward: dq, dk, dv for dout, with D = rowsum(dout * out) of the exact out.
inline Reference reference(const Sizes& s, const FwdParams& p, const HostInputs& in,
                           bool backward) {
  const int H = s.nheads, Hk = s.nheads_k, d = s.headdim, dv = s.headdim_v, g = H / Hk;
  const double scale = p.softmax_scale, cap = p.softcap;
  const int wl = p.window_left, wr = p.window_right;
  Reference r;
  r.out.assign(size_t(s.total_q()) * H * dv, 0.0);
  r.lse.assign(size_t(s.total_q()) * H, -INFINITY);
  if (backward) {
    r.dq.assign(in.q.size(), 0.0);
    r.dk.assign(in.k.size(), 0.0);
    r.dv.assign(in.v.size(), 0.0);
  }
  auto qp = [&](int64_t row, int h) { return &in.q[(size_t(row) * H + h) * d]; };
  auto kp = [&](int64_t row, int h) { return &in.k[(size_t(row) * Hk + h) * d]; };
  auto vp = [&](int64_t row, int h) { return &in.v[(size_t(row) * Hk + h) * dv]; };
  auto dop = [&](int64_t row, int h) { return &in.dout[(size_t(row) * H + h) * dv]; };
  for (int b = 0; b < s.batch; ++b) {
    const int sq = s.lq[b], sk = s.lk[b], shift = sk - sq;
    const int64_t q0 = s.cu_q[b], k0 = s.cu_k[b];
    for (int h = 0; h < H; ++h) {
      const int hk = h / g;
      const double slope =
          in.alibi_slopes.empty() ? 0.0 : in.alibi_slopes[b * p.alibi_batch_stride + h];
      // Backward: P (and tanh of the capped score, for its derivative) of the (b, h) block.
      std::vector<double> P(backward ? size_t(sq) * sk : 0, 0.0);
      std::vector<double> T(backward && cap > 0 ? P.size() : 0);
      std::vector<double> sc(sk);
      for (int i = 0; i < sq; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j < sk; ++j) {
          const bool vis = (wl < 0 || j >= i + shift - wl) && (wr < 0 || j <= i + shift + wr);
          if (!vis) {
            sc[j] = -INFINITY;
            continue;
          }
          const float *qi = qp(q0 + i, h), *kj = kp(k0 + j, hk);
          double dot = 0;
          for (int e = 0; e < d; ++e) dot += double(qi[e]) * kj[e];
          double x = dot * scale;
          if (cap > 0) {
            const double th = std::tanh(x / cap);
            x = cap * th;
            if (!T.empty()) T[size_t(i) * sk + j] = th;
          }
          x -= slope * std::abs(double(i + shift - j));
          sc[j] = x;
          mx = std::max(mx, x);
        }
        if (mx == -INFINITY) continue;  // no visible key: out 0, lse -inf
        double sum = 0;
        for (int j = 0; j < sk; ++j)
          if (sc[j] != -INFINITY) sum += std::exp(sc[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[lse_offset(p, s, b, h, i)] = lse;
        double* o = &r.out[(size_t(q0 + i) * H + h) * dv];
        for (int j = 0; j < sk; ++j) {
          if (sc[j] == -INFINITY) continue;
          const double pij = std::exp(sc[j] - lse);
          if (backward) P[size_t(i) * sk + j] = pij;
          const float* vj = vp(k0 + j, hk);
          for (int e = 0; e < dv; ++e) o[e] += pij * vj[e];
        }
      }
      if (!backward) continue;
      for (int i = 0; i < sq; ++i) {
        const float* doi = dop(q0 + i, h);
        const double* o = &r.out[(size_t(q0 + i) * H + h) * dv];
        double D = 0;
        for (int e = 0; e < dv; ++e) D += o[e] * doi[e];
        const float* qi = qp(q0 + i, h);
        double* dqi = &r.dq[(size_t(q0 + i) * H + h) * d];
        for (int j = 0; j < sk; ++j) {
          const double pij = P[size_t(i) * sk + j];
          if (pij == 0) continue;
          const float *kj = kp(k0 + j, hk), *vj = vp(k0 + j, hk);
          double dp = 0;
          for (int e = 0; e < dv; ++e) dp += double(doi[e]) * vj[e];
          double ds = pij * (dp - D);
          if (!T.empty()) {
            const double th = T[size_t(i) * sk + j];
            ds *= 1 - th * th;
          }
          ds *= scale;
          double* dkj = &r.dk[(size_t(k0 + j) * Hk + hk) * d];
          double* dvj = &r.dv[(size_t(k0 + j) * Hk + hk) * dv];
          for (int e = 0; e < d; ++e) {
            dqi[e] += ds * kj[e];
            dkj[e] += ds * qi[e];
          }
          for (int e = 0; e < dv; ++e) dvj[e] += pij * doi[e];
        }
      }
    }
  }
  return r;
}

// Largest |got - want| and |want| over the finite outputs; non-finite outputs counted.
struct ErrStats {
  double max_err = 0, max_ref = 0;
  int64_t nonfinite = 0;
  void add(double got, double want) {
    if (!std::isfinite(got)) {
      ++nonfinite;
      return;
    }
    max_err = std::max(max_err, std::abs(got - want));
    max_ref = std::max(max_ref, std::abs(want));
  }
  double rel() const { return max_ref > 0 ? max_err / max_ref : max_err; }
};

// An lse against the reference's: -inf must be -inf, else finite (counted in `bad` when not).
inline void check_lse(double got, double want, double& max_err, int64_t& bad) {
  if (std::isinf(want)) {
    if (!(std::isinf(got) && got < 0)) ++bad;
  } else if (!std::isfinite(got)) {
    ++bad;
  } else {
    max_err = std::max(max_err, std::abs(got - want));
  }
}

}  // namespace flashattn::selftest
