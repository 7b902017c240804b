// Standalone self-test and timer of the sm80 forward (no torch): random inputs for a set of
// shapes and features, flashattn::sm80::run_fwd against a float64 CPU reference, poisoned
// outputs (NaN) and guard zones to catch unwritten or out-of-bounds elements; then TFLOP/s
// over the benchmark grid (bf16, hidden 2048, B = 16384 / N).
// Build: nvcc -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -I csrc
//        tools/selftest/selftest_fwd_sm80.cu csrc/sm80/dispatch_fwd_sm80.cu
//        csrc/instantiations/fwd_sm80_*.cu
// Run:   ./selftest [--no-bench] [--no-test] [--variants]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/mask.h"
#include "common/params.h"
#include "common/seqlen.h"
#include "sm80/launch_fwd_sm80.cuh"
#include "sm80/sm80_backend.h"
#include "selftest_util.cuh"


using flashattn::DType;
using flashattn::FwdParams;

namespace {

constexpr uint16_t kPoison = 0xFFFF;  // NaN in fp16 and bf16
constexpr int64_t kGuard = 4096;      // elements of poison after every buffer

float to_float(uint16_t x, bool fp16) {
  if (fp16) {
    __half_raw r;
    r.x = x;
    return __half2float(__half(r));
  }
  uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t from_float(float f, bool fp16) {
  if (fp16) {
    __half h = __float2half_rn(f);
    return __half_raw(h).x;
  }
  __nv_bfloat16 b = __float2bfloat16_rn(f);
  return __nv_bfloat16_raw(b).x;
}

struct Case {
  std::string name;
  int B, Sq, Sk, H, Hk, d, dv;
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0.f;
  bool alibi = false;
  bool varlen = false;
  bool fp16 = false;
  int pad = 0;            // extra elements per head row (strided, non-contiguous heads)
  bool misalign = false;  // base pointers offset by one element (2-byte aligned)
  bool small_smem = false;  // run the small-shared-memory tile (fwd_tile_small_smem), bf16
  bool bad_meta = false;    // corrupt cu_seqlens on the device: only bounds are checked
};

template <int D>
void run_small_smem(const FwdParams& p) {
  constexpr auto t = flashattn::sm80::fwd_tile_small_smem(D);
  flashattn::sm80::launch_fwd_variants<flashattn::sm80::FwdTraits<
      D, __nv_bfloat16, t.block_m, t.block_n, t.warps, t.stages, t.min_blocks>>(p, nullptr);
}

// A (rows, H, ld) buffer of 16-bit elements with guard poison after it.
struct Buf {
  int64_t rows, H, ld, off;
  std::vector<uint16_t> host;
  uint16_t* dev = nullptr;
  int64_t elems() const { return off + rows * H * ld + kGuard; }
  uint16_t& at(int64_t r, int64_t h, int64_t c) { return host[off + (r * H + h) * ld + c]; }
};

Buf make_buf(int64_t rows, int64_t H, int64_t ld, bool misalign) {
  Buf b{rows, H, ld, misalign ? 1 : 0, {}, nullptr};
  b.host.assign(b.elems(), kPoison);
  CK(cudaMalloc(&b.dev, b.elems() * 2));
  return b;
}

bool run_case(const Case& c, std::mt19937& rng) {
  const bool fp16 = c.fp16;
  std::normal_distribution<float> nd(0.f, 1.f);
  // Sequence lengths: padded = all equal; varlen = random in [0, S] with sequence 1 empty.
  std::vector<int> lq(c.B, c.Sq), lk(c.B, c.Sk);
  if (c.varlen) {
    for (int b = 0; b < c.B; ++b) {
      lq[b] = b == 1 ? 0 : int(rng() % (c.Sq + 1));
      lk[b] = b == 2 ? 0 : int(rng() % (c.Sk + 1));
    }
    lq[0] = c.Sq;
    lk[0] = c.Sk;
  }
  std::vector<int> cuq(c.B + 1, 0), cuk(c.B + 1, 0);
  for (int b = 0; b < c.B; ++b) {
    cuq[b + 1] = cuq[b] + lq[b];
    cuk[b + 1] = cuk[b] + lk[b];
  }
  const int64_t rq = c.varlen ? cuq[c.B] : int64_t(c.B) * c.Sq;
  const int64_t rk = c.varlen ? cuk[c.B] : int64_t(c.B) * c.Sk;
  Buf q = make_buf(rq, c.H, c.d + c.pad, c.misalign), k = make_buf(rk, c.Hk, c.d + c.pad, c.misalign);
  Buf v = make_buf(rk, c.Hk, c.dv + c.pad, c.misalign), o = make_buf(rq, c.H, c.dv + c.pad, c.misalign);
  for (Buf* t : {&q, &k})
    for (int64_t r = 0; r < t->rows; ++r)
      for (int h = 0; h < t->H; ++h)
        for (int i = 0; i < c.d; ++i) t->at(r, h, i) = from_float(nd(rng), fp16);
  for (int64_t r = 0; r < v.rows; ++r)
    for (int h = 0; h < v.H; ++h)
      for (int i = 0; i < c.dv; ++i) v.at(r, h, i) = from_float(nd(rng), fp16);
  for (Buf* t : {&q, &k, &v, &o}) CK(cudaMemcpy(t->dev, t->host.data(), t->elems() * 2, cudaMemcpyHostToDevice));

  const int64_t lse_n = int64_t(c.H) * rq;
  float* lse_d;
  CK(cudaMalloc(&lse_d, (lse_n + kGuard) * 4));
  CK(cudaMemset(lse_d, 0xFF, (lse_n + kGuard) * 4));  // NaN
  std::vector<float> slopes(c.H);
  for (int h = 0; h < c.H; ++h) slopes[h] = c.alibi ? std::pow(2.f, -8.f * (h + 1) / c.H) : 0.f;
  float* slopes_d = nullptr;
  int32_t *cuq_d = nullptr, *cuk_d = nullptr;
  if (c.alibi) {
    CK(cudaMalloc(&slopes_d, c.H * 4));
    CK(cudaMemcpy(slopes_d, slopes.data(), c.H * 4, cudaMemcpyHostToDevice));
  }
  if (c.varlen) {
    CK(cudaMalloc(&cuq_d, (c.B + 1) * 4));
    CK(cudaMalloc(&cuk_d, (c.B + 1) * 4));
    CK(cudaMemcpy(cuq_d, cuq.data(), (c.B + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(cuk_d, cuk.data(), (c.B + 1) * 4, cudaMemcpyHostToDevice));
  }

  FwdParams p;
  auto fill = [&](const Buf& t, const void*& ptr, int64_t& bs, int64_t& rs, int64_t& hs, int64_t S) {
    ptr = t.dev + t.off;
    rs = t.H * t.ld;
    hs = t.ld;
    bs = c.varlen ? 0 : S * rs;
  };
  fill(q, p.q_ptr, p.q_batch_stride, p.q_row_stride, p.q_head_stride, c.Sq);
  fill(k, p.k_ptr, p.k_batch_stride, p.k_row_stride, p.k_head_stride, c.Sk);
  fill(v, p.v_ptr, p.v_batch_stride, p.v_row_stride, p.v_head_stride, c.Sk);
  const void* optr;
  fill(o, optr, p.o_batch_stride, p.o_row_stride, p.o_head_stride, c.Sq);
  p.o_ptr = const_cast<void*>(optr);
  p.lse_ptr = lse_d;
  p.lse_batch_stride = c.varlen ? 0 : int64_t(c.H) * c.Sq;
  p.lse_head_stride = c.varlen ? rq : c.Sq;
  p.batch = c.B;
  p.nheads = c.H;
  p.nheads_k = c.Hk;
  p.headdim = c.d;
  p.headdim_v = c.dv;
  p.seqlen_q = c.varlen ? *std::max_element(lq.begin(), lq.end()) : c.Sq;
  p.seqlen_k = c.varlen ? *std::max_element(lk.begin(), lk.end()) : c.Sk;
  p.total_q = rq;
  p.total_k = rk;
  p.cu_seqlens_q = cuq_d;
  p.cu_seqlens_k = cuk_d;
  p.is_varlen = c.varlen;
  p.dtype = fp16 ? DType::kFloat16 : DType::kBFloat16;
  p.softmax_scale = 1.f / std::sqrt(float(c.d));
  p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
  p.softcap = c.softcap;
  p.window_left = c.wl;
  p.window_right = c.causal ? 0 : c.wr;
  p.alibi_slopes = slopes_d;
  if (c.bad_meta) {  // decreasing, negative and past-the-end offsets
    std::vector<int32_t> bad = {5, 900000, 40, -7, int32_t(rq) + 1000};
    bad.resize(c.B + 1, int32_t(rq) + 3);
    CK(cudaMemcpy(cuq_d, bad.data(), (c.B + 1) * 4, cudaMemcpyHostToDevice));
    std::reverse(bad.begin(), bad.end());
    CK(cudaMemcpy(cuk_d, bad.data(), (c.B + 1) * 4, cudaMemcpyHostToDevice));
  }
  if (c.small_smem) {
    if (c.d > 192) run_small_smem<256>(p);
    else run_small_smem<192>(p);
  } else {
    flashattn::sm80::run_fwd(p, nullptr);
  }
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(o.host.data(), o.dev, o.elems() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> lse(lse_n + kGuard);
  CK(cudaMemcpy(lse.data(), lse_d, (lse_n + kGuard) * 4, cudaMemcpyDeviceToHost));

  if (c.bad_meta) {  // wrong numbers are allowed, writes past the buffers are not
    int64_t stray = 0;
    for (int64_t i = o.off + o.rows * o.H * o.ld; i < o.elems(); ++i) stray += o.host[i] != kPoison;
    for (int64_t i = 0; i < o.off; ++i) stray += o.host[i] != kPoison;
    for (int64_t i = lse_n; i < lse_n + kGuard; ++i) stray += !std::isnan(lse[i]);
    std::printf("%-34s %s  (bounds only) stray %lld\n", c.name.c_str(), stray ? "FAIL" : "PASS",
                (long long)stray);
    for (Buf* t : {&q, &k, &v, &o}) CK(cudaFree(t->dev));
    CK(cudaFree(lse_d));
    CK(cudaFree(cuq_d));
    CK(cudaFree(cuk_d));
    return stray == 0;
  }
  // Reference in float64 on the rounded inputs.
  double max_err = 0, max_ref = 0, lse_err = 0;
  int64_t bad = 0;
  for (int b = 0; b < c.B; ++b) {
    flashattn::SeqInfo s;
    s.seqlen_q = lq[b];
    s.seqlen_k = lk[b];
    s.q_row0 = c.varlen ? cuq[b] : int64_t(b) * c.Sq;
    s.k_row0 = c.varlen ? cuk[b] : int64_t(b) * c.Sk;
    const flashattn::MaskInfo m = flashattn::mask_info(p, s);
    std::vector<double> sc(lk[b]);
    for (int h = 0; h < c.H; ++h) {
      const int hk = h / (c.H / c.Hk);
      for (int i = 0; i < lq[b]; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j < lk[b]; ++j) {
          if (!m.visible(i, j)) { sc[j] = -INFINITY; continue; }
          double dot = 0;
          for (int e = 0; e < c.d; ++e)
            dot += double(to_float(q.at(s.q_row0 + i, h, e), fp16)) *
                   to_float(k.at(s.k_row0 + j, hk, e), fp16);
          double x = dot * p.softmax_scale;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          x -= double(slopes[h]) * std::abs(double(i + m.shift() - j));
          sc[j] = x;
          mx = std::max(mx, x);
        }
        double sum = 0;
        for (int j = 0; j < lk[b]; ++j) sum += (sc[j] == -INFINITY) ? 0.0 : std::exp(sc[j] - mx);
        const double ref_lse = sum == 0 ? -INFINITY : mx + std::log(sum);
        const float got_lse = lse[h * p.lse_head_stride + b * p.lse_batch_stride +
                                  (c.varlen ? s.q_row0 : 0) + i];
        if (sum == 0) {
          if (!(std::isinf(got_lse) && got_lse < 0)) ++bad;
        } else if (!std::isfinite(got_lse)) {
          ++bad;
        } else {
          lse_err = std::max(lse_err, std::abs(double(got_lse) - ref_lse));
        }
        for (int e = 0; e < c.dv; ++e) {
          double ref = 0;
          if (sum > 0)
            for (int j = 0; j < lk[b]; ++j)
              if (sc[j] != -INFINITY)
                ref += std::exp(sc[j] - mx) / sum * to_float(v.at(s.k_row0 + j, hk, e), fp16);
          const float got = to_float(o.at(s.q_row0 + i, h, e), fp16);
          if (!std::isfinite(got)) { ++bad; continue; }
          max_err = std::max(max_err, std::abs(got - ref));
          max_ref = std::max(max_ref, std::abs(ref));
        }
      }
    }
  }
  // Nothing written outside the valid region: row padding, rows of no sequence, guards.
  int64_t stray = 0;
  std::vector<char> valid_row(o.rows, 0);
  for (int b = 0; b < c.B; ++b)
    for (int i = 0; i < lq[b]; ++i) valid_row[(c.varlen ? cuq[b] : int64_t(b) * c.Sq) + i] = 1;
  for (int64_t r = 0; r < o.rows; ++r)
    for (int h = 0; h < o.H; ++h)
      for (int e = valid_row[r] ? c.dv : 0; e < o.ld; ++e) stray += o.at(r, h, e) != kPoison;
  for (int64_t i = 0; i < o.off; ++i) stray += o.host[i] != kPoison;
  for (int64_t i = o.off + o.rows * o.H * o.ld; i < o.elems(); ++i) stray += o.host[i] != kPoison;
  for (int64_t i = lse_n; i < lse_n + kGuard; ++i) stray += !std::isnan(lse[i]);

  const double eps = fp16 ? 1.0 / 2048 : 1.0 / 256;
  const double tol = 2 * eps * std::max(max_ref, 0.05);
  const bool ok = bad == 0 && stray == 0 && max_err <= tol && lse_err <= 2e-3;
  std::printf("%-34s %s  max_abs_err %.2e (tol %.1e, max|ref| %.2f, rel %.2e)  lse_err %.1e"
              "  bad %lld  stray %lld\n",
              c.name.c_str(), ok ? "PASS" : "FAIL", max_err, tol, max_ref,
              max_err / std::max(max_ref, 1e-6), lse_err, (long long)bad, (long long)stray);
  for (Buf* t : {&q, &k, &v, &o}) CK(cudaFree(t->dev));
  CK(cudaFree(lse_d));
  if (slopes_d) CK(cudaFree(slopes_d));
  if (cuq_d) CK(cudaFree(cuq_d));
  if (cuk_d) CK(cudaFree(cuk_d));
  return ok;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](Case c) { v.push_back(c); };
  for (int d : {32, 64, 96, 128, 192, 256}) {
    add({"d" + std::to_string(d) + " 2x203x317", 2, 203, 317, 4, 4, d, d});
    Case c{"d" + std::to_string(d) + " causal 257x129 gqa", 2, 257, 129, 4, 2, d, d};
    c.causal = true;
    add(c);
  }
  Case c;
  c = {"d128 fp16 causal 300x300", 1, 300, 300, 3, 3, 128, 128}; c.causal = true; c.fp16 = true; add(c);
  c = {"d64 fp16 1x239", 2, 1, 239, 2, 1, 64, 64}; c.fp16 = true; add(c);
  c = {"d128 799x3 causal", 1, 799, 3, 2, 2, 128, 128}; c.causal = true; add(c);
  c = {"d128 window(64,16) 400x500", 2, 400, 500, 2, 2, 128, 128}; c.wl = 64; c.wr = 16; add(c);
  c = {"d64 window(-1,0)=causal sq>sk", 1, 300, 170, 2, 1, 64, 64}; c.wr = 0; add(c);
  c = {"d128 softcap 30 alibi causal", 2, 200, 260, 4, 2, 128, 128}; c.softcap = 30.f; c.alibi = true; c.causal = true; add(c);
  c = {"d96 alibi", 1, 130, 333, 2, 2, 96, 96}; c.alibi = true; add(c);
  c = {"d40 (bucket 64) mqa", 2, 150, 190, 4, 1, 40, 40}; add(c);
  c = {"d100 dv 64 (bucket 128)", 1, 170, 210, 2, 2, 100, 64}; add(c);
  c = {"d59 dv 59 odd, misaligned", 1, 140, 150, 2, 2, 59, 59}; c.misalign = true; c.pad = 3; add(c);
  c = {"d128 strided heads (pad 8)", 2, 190, 190, 2, 2, 128, 128}; c.pad = 8; add(c);
  c = {"d128 misaligned (even-K off)", 1, 130, 130, 2, 2, 128, 128}; c.misalign = true; add(c);
  c = {"d256 dv 192 causal", 1, 150, 200, 2, 2, 256, 192}; c.causal = true; add(c);
  c = {"d8 (bucket 32)", 1, 77, 99, 2, 2, 8, 8}; add(c);
  c = {"varlen d128 causal", 4, 300, 280, 2, 1, 128, 128}; c.varlen = true; c.causal = true; add(c);
  c = {"d64 dv 128 (bucket 128) causal", 2, 140, 180, 2, 1, 64, 128}; c.causal = true; add(c);
  c = {"d192 small-smem tile", 2, 203, 317, 2, 2, 192, 192}; c.small_smem = true; add(c);
  c = {"d256 small-smem tile causal alibi", 2, 203, 150, 2, 1, 256, 256}; c.small_smem = true; c.causal = true; c.alibi = true; add(c);
  c = {"d200 small-smem tile (bucket 256)", 1, 100, 130, 2, 2, 200, 200}; c.small_smem = true; add(c);
  c = {"varlen bad cu_seqlens d128", 4, 200, 200, 2, 2, 128, 128}; c.varlen = true; c.bad_meta = true; add(c);
  c = {"varlen bad cu_seqlens d59", 4, 200, 200, 2, 2, 59, 59}; c.varlen = true; c.bad_meta = true; add(c);
  c = {"varlen d64 window(32,32) fp16", 4, 260, 310, 2, 2, 64, 64}; c.varlen = true; c.wl = 32; c.wr = 32; c.fp16 = true; add(c);
  return v;
}

// Buffers and params of one benchmark cell (bf16, contiguous (B, N, H, d), hidden 2048).
struct Cell {
  int d, N, causal, B, H;
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  FwdParams p;
  Cell(int d_, int N_, int causal_) : d(d_), N(N_), causal(causal_), B(16384 / N_), H(2048 / d_) {
    const int64_t n = int64_t(B) * N * H * d;
    std::vector<uint16_t> host(n);
    std::mt19937 rng(N + d);
    for (auto& x : host) x = from_float(float(int(rng() % 2001) - 1000) / 1000.f, false);
    for (uint16_t** t : {&q, &k, &v, &o}) {
      CK(cudaMalloc(t, n * 2));
      CK(cudaMemcpy(*t, host.data(), n * 2, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&lse, int64_t(B) * H * N * 4));
    p.q_ptr = q; p.k_ptr = k; p.v_ptr = v; p.o_ptr = o; p.lse_ptr = lse;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t(H) * d;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = int64_t(N) * H * d;
    p.lse_batch_stride = int64_t(H) * N;
    p.lse_head_stride = N;
    p.batch = B; p.nheads = p.nheads_k = H; p.headdim = p.headdim_v = d;
    p.seqlen_q = p.seqlen_k = N; p.total_q = p.total_k = int64_t(B) * N;
    p.dtype = DType::kBFloat16;
    p.softmax_scale = 1.f / std::sqrt(float(d));
    p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
    p.window_right = causal ? 0 : -1;
  }
  ~Cell() {
    for (uint16_t* t : {q, k, v, o}) cudaFree(t);
    cudaFree(lse);
  }
  double flops() const { return 4.0 * B * H * double(N) * N * d / (causal ? 2 : 1); }
  template <typename F>
  double time_ms(F&& f) const {
    return median_ms(f);
  }
};

void bench() {
  std::printf("\n%-5s %-6s %-6s %10s %10s\n", "d", "N", "causal", "ms", "TFLOP/s");
  for (int d : {64, 128, 256})
    for (int N : {512, 1024, 2048, 4096, 8192, 16384})
      for (int causal = 0; causal < 2; ++causal) {
        Cell c(d, N, causal);
        const double ms = c.time_ms([&] { flashattn::sm80::run_fwd(c.p, nullptr); });
        std::printf("%-5d %-6d %-6d %10.3f %10.1f\n", d, N, causal, ms, c.flops() / ms / 1e9);
      }
}

// Tile alternatives timed side by side (same cells, same process).
template <int D, int BM, int BN, int W, int S, int MB>
void variant(Cell& c, bool heavy_first = false) {
  using T = flashattn::sm80::FwdTraits<D, __nv_bfloat16, BM, BN, W, S, MB>;
  const dim3 grid((c.N + BM - 1) / BM, c.H, c.B);
  const double ms = c.time_ms([&] {
    flashattn::sm80::launch_fwd<T, true, false>(c.p, true, grid, nullptr, heavy_first);
  });
  std::printf("  %3dx%-3d w%d s%d mb%d%s: %8.3f ms %7.1f TFLOP/s\n", BM, BN, W, S, MB,
              heavy_first ? " heavy-first" : "", ms, c.flops() / ms / 1e9);
}

void bench_variants() {
  // d256 causal at small N: 128-row tiles waste more of the diagonal and leave a tail.
  for (int N : {512, 1024, 2048})
    for (int causal = 0; causal < 2; ++causal) {
      Cell c(256, N, causal);
      std::printf("d256 N %d causal %d\n", N, causal);
      variant<256, 128, 64, 8, 1, 1>(c);
      variant<256, 128, 64, 8, 1, 1>(c, true);
      variant<256, 64, 32, 4, 2, 2>(c);
      variant<256, 64, 32, 4, 2, 2>(c, true);
      variant<256, 64, 64, 4, 1, 2>(c);  // FA2's H100 choice
      variant<256, 64, 64, 4, 1, 2>(c, true);
    }
  for (int d : {64, 128})
    for (int N : {512, 2048, 16384}) {
      Cell c(d, N, 1);
      std::printf("d%d N %d causal 1\n", d, N);
      if (d == 64) {
        variant<64, 128, 128, 4, 2, 2>(c);
        variant<64, 128, 128, 4, 2, 2>(c, true);
      } else {
        variant<128, 128, 64, 4, 2, 2>(c);
        variant<128, 128, 64, 4, 2, 2>(c, true);
      }
    }
  for (int N : {2048, 8192})
    for (int causal = 0; causal < 2; ++causal) {
      {
        Cell c(128, N, causal);
        std::printf("d128 N %d causal %d\n", N, causal);
        variant<128, 128, 64, 4, 2, 2>(c);
        variant<128, 128, 64, 4, 1, 2>(c);
      }
      {
        Cell c(256, N, causal);
        std::printf("d256 N %d causal %d\n", N, causal);
        variant<256, 128, 64, 8, 2, 1>(c);
        variant<256, 128, 64, 8, 1, 1>(c);
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  bool do_test = true, do_bench = true, do_variants = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-bench")) do_bench = false;
    if (!std::strcmp(argv[i], "--no-test")) do_test = false;
    if (!std::strcmp(argv[i], "--variants")) do_variants = true;
  }
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  int fails = 0, n = 0;
  if (do_test)
    for (const Case& c : cases()) {
      try {
        fails += !run_case(c, rng);
      } catch (const std::exception& e) {
        std::printf("%-34s FAIL  exception: %s\n", c.name.c_str(), e.what());
        ++fails;
      }
      ++n;
    }
  if (do_test) std::printf("correctness: %d/%d cases pass\n", n - fails, n);
  if (do_bench) bench();
  if (do_variants) bench_variants();
  return fails ? 1 : 0;
}
