// Self-test of the Hopper forward (csrc/sm90/kernel_fwd_sm90.cuh), no torch: odd
// shapes against a float64 CPU reference (out and lse, NaN-poisoned outputs), then TFLOP/s
// beside the sm80 kernel on the benchmark's d128 cells, in the same process. On the H200:
//   A="-std=c++17 -O3 -I csrc"; S80="-gencode=arch=compute_90,code=sm_90"
//   for f in csrc/sm80/dispatch_fwd_sm80.cu csrc/instantiations/fwd_sm80_*.cu; do
//     nvcc $A $S80 -c $f -o /tmp/$(basename $f .cu).o & done
//   nvcc $A -gencode=arch=compute_90a,code=sm_90a -c tools/selftest/selftest_fwd_sm90.cu -o /tmp/st90.o
//   wait; nvcc /tmp/*.o -o selftest_fwd_sm90 && ./selftest_fwd_sm90 [--no-bench]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "sm80/sm80_backend.h"
#include "sm90/launch_fwd_sm90.cuh"
#include "selftest_util.cuh"

using namespace flashattn;
using bf16 = __nv_bfloat16;


struct Problem {
  int B, H, Hk, sq, sk, wl, wr;
  bf16 *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  std::vector<float> hq, hk, hv;
  FwdParams p;

  Problem(int B_, int H_, int Hk_, int sq_, int sk_, int wl_, int wr_, unsigned seed)
      : B(B_), H(H_), Hk(Hk_), sq(sq_), sk(sk_), wl(wl_), wr(wr_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto make = [&](bf16** dev, std::vector<float>& host, size_t n) {
      std::vector<bf16> b(n);
      host.resize(n);
      for (size_t i = 0; i < n; ++i) {
        b[i] = __float2bfloat16(nd(rng));
        host[i] = __bfloat162float(b[i]);
      }
      CK(cudaMalloc(dev, n * 2));
      CK(cudaMemcpy(*dev, b.data(), n * 2, cudaMemcpyHostToDevice));
    };
    const int d = 128;
    make(&q, hq, size_t(B) * sq * H * d);
    make(&k, hk, size_t(B) * sk * Hk * d);
    make(&v, hv, size_t(B) * sk * Hk * d);
    CK(cudaMalloc(&o, size_t(B) * sq * H * d * 2));
    CK(cudaMalloc(&lse, size_t(B) * H * sq * 4));
    p.q_ptr = q; p.k_ptr = k; p.v_ptr = v; p.o_ptr = o; p.lse_ptr = lse;
    p.q_row_stride = p.o_row_stride = int64_t(H) * d;
    p.q_head_stride = p.o_head_stride = d;
    p.q_batch_stride = p.o_batch_stride = int64_t(sq) * H * d;
    p.k_row_stride = p.v_row_stride = int64_t(Hk) * d;
    p.k_head_stride = p.v_head_stride = d;
    p.k_batch_stride = p.v_batch_stride = int64_t(sk) * Hk * d;
    p.lse_batch_stride = int64_t(H) * sq;
    p.lse_head_stride = sq;
    p.batch = B; p.nheads = H; p.nheads_k = Hk; p.headdim = p.headdim_v = d;
    p.seqlen_q = sq; p.seqlen_k = sk; p.total_q = int64_t(B) * sq; p.total_k = int64_t(B) * sk;
    p.dtype = DType::kBFloat16;
    p.softmax_scale = 1.f / std::sqrt(float(d));
    p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
    p.window_left = wl; p.window_right = wr;
  }
  ~Problem() {
    for (void* x : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)lse}) cudaFree(x);
  }
  double flops() const {  // the benchmark's rule: 4 B H N^2 d, halved when causal
    return 4.0 * B * H * double(sq) * sk * 128 * (wr == 0 && wl < 0 ? 0.5 : 1.0);
  }
};

// Max error of out (relative to its max) and of lse (absolute) against float64.
template <typename Run>
static bool check(Problem& pr, const char* name, Run&& run) {
  const int d = 128, g = pr.H / pr.Hk;
  CK(cudaMemset(pr.o, 0xFF, size_t(pr.B) * pr.sq * pr.H * d * 2));
  CK(cudaMemset(pr.lse, 0xFF, size_t(pr.B) * pr.H * pr.sq * 4));
  run(pr.p);
  CK(cudaDeviceSynchronize());
  std::vector<bf16> go(size_t(pr.B) * pr.sq * pr.H * d);
  std::vector<float> gl(size_t(pr.B) * pr.H * pr.sq);
  CK(cudaMemcpy(go.data(), pr.o, go.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gl.data(), pr.lse, gl.size() * 4, cudaMemcpyDeviceToHost));
  const MaskInfo mi{pr.sq, pr.sk, pr.wl, pr.wr};
  double err_o = 0, max_o = 0, err_l = 0;
  int bad = 0;
  std::vector<double> sc(pr.sk), acc(d);
  for (int b = 0; b < pr.B; ++b)
    for (int h = 0; h < pr.H; ++h)
      for (int i = 0; i < pr.sq; ++i) {
        const float* qi = &pr.hq[((size_t(b) * pr.sq + i) * pr.H + h) * d];
        double mx = -INFINITY;
        for (int j = 0; j < pr.sk; ++j) {
          if (!mi.visible(i, j)) { sc[j] = -INFINITY; continue; }
          const float* kj = &pr.hk[((size_t(b) * pr.sk + j) * pr.Hk + h / g) * d];
          double s = 0;
          for (int c = 0; c < d; ++c) s += double(qi[c]) * kj[c];
          sc[j] = s * pr.p.softmax_scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = 0; j < pr.sk; ++j) {
          if (sc[j] == -INFINITY) continue;
          const double w = std::exp(sc[j] - mx);
          sum += w;
          const float* vj = &pr.hv[((size_t(b) * pr.sk + j) * pr.Hk + h / g) * d];
          for (int c = 0; c < d; ++c) acc[c] += w * vj[c];
        }
        const double lse = sum > 0 ? mx + std::log(sum) : -INFINITY;
        const float gl_i = gl[(size_t(b) * pr.H + h) * pr.sq + i];
        if (std::isinf(lse)) {
          if (!(std::isinf(gl_i) && gl_i < 0)) ++bad;
        } else if (!std::isfinite(gl_i)) {
          ++bad;
        } else {
          err_l = std::max(err_l, std::fabs(gl_i - lse));
        }
        for (int c = 0; c < d; ++c) {
          const double want = sum > 0 ? acc[c] / sum : 0.0;
          const float got = __bfloat162float(go[((size_t(b) * pr.sq + i) * pr.H + h) * d + c]);
          if (!std::isfinite(got)) { ++bad; continue; }
          err_o = std::max(err_o, std::fabs(got - want));
          max_o = std::max(max_o, std::fabs(want));
        }
      }
  const double rel_o = err_o / std::max(max_o, 1e-6);
  const bool ok = bad == 0 && rel_o < 1e-2 && err_l < 1e-3;
  std::printf("%-40s out %.2e lse %.2e nonfinite %d  %s\n", name, rel_o, err_l, bad,
              ok ? "ok" : "FAIL");
  return ok;
}


static void run90(const FwdParams& p) { sm90::run_fwd_hdim<128, bf16>(p, nullptr); }

int main(int argc, char** argv) {
  const bool bench = !(argc > 1 && std::strcmp(argv[1], "--no-bench") == 0);
  const unsigned seed = std::random_device{}();
  struct Case { const char* name; int B, H, Hk, sq, sk, wl, wr; };
  const Case cases[] = {
      {"128/128", 1, 2, 2, 128, 128, -1, -1},
      {"gqa causal 200/333", 2, 3, 1, 200, 333, -1, 0},
      {"causal 333/200 (rows with no key)", 1, 2, 2, 333, 200, -1, 0},
      {"window (100, 20) 1000/1000", 1, 2, 2, 1000, 1000, 100, 20},
      {"1/500", 2, 4, 2, 1, 500, -1, -1},
      {"causal 700/700", 1, 2, 2, 700, 700, -1, 0},
      {"257/1", 1, 1, 1, 257, 1, -1, -1},
      {"mqa 1100/900 (3 query blocks)", 1, 4, 1, 1100, 900, -1, -1},
      {"left window only (50, -1) 300/400", 1, 2, 2, 300, 400, 50, -1},
      {"no keys 100/0", 2, 2, 1, 100, 0, -1, -1},
  };
  int failed = 0;
  int n = 0;
  for (const Case& c : cases) {
    Problem pr(c.B, c.H, c.Hk, c.sq, c.sk, c.wl, c.wr, seed);
    failed += !check(pr, c.name, [](const FwdParams& p) { run90(p); });
    n += 1;
  }
  std::printf("seed %u: %d of %d cases failed\n", seed, failed, n);
  if (!bench) return failed ? 1 : 0;
  std::printf("\nTFLOP/s, d128 bf16, B*N = 16k, H = 16 (sm80: our portable kernel)\n");
  std::printf("%-6s %-6s %10s %10s %8s\n", "N", "causal", "sm90", "sm80", "90/80");
  for (int N : {1024, 2048, 4096, 8192, 16384})
    for (int causal = 0; causal < 2; ++causal) {
      Problem pr(16384 / N, 16, 16, N, N, -1, causal ? 0 : -1, 1);
      const double f = pr.flops() * 1e-9;
      const double t0 = median_ms([&] { run90(pr.p); });
      const double t80 = median_ms([&] { sm80::run_fwd(pr.p, nullptr); });
      std::printf("%-6d %-6d %10.1f %10.1f %8.2f\n", N, causal, f / t0, f / t80, t80 / t0);
    }
  return failed ? 1 : 0;
}
