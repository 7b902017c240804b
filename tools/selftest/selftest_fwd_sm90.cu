// Self-test of the Hopper forward (csrc/sm90/kernel_fwd_sm90.cuh), no torch: odd shapes
// against the float64 CPU reference of selftest_problem.h (out and lse, NaN-poisoned outputs;
// params built as the package builds them), then TFLOP/s beside the sm80 kernel on the
// benchmark's d128 cells, in the same process. On the H200:
//   A="-std=c++17 -O3 -I csrc"; O=/tmp/st90; mkdir -p $O
//   S80="-gencode=arch=compute_90,code=sm_90"; S90="-gencode=arch=compute_90a,code=sm_90a"
//   for f in csrc/sm80/dispatch_fwd_sm80.cu csrc/instantiations/fwd_sm80_*.cu; do
//     nvcc $A $S80 -c $f -o $O/$(basename $f .cu).o & done
//   nvcc $A $S90 -c tools/selftest/selftest_fwd_sm90.cu -o $O/selftest_fwd_sm90.o
//   wait; nvcc $O/*.o -o selftest_fwd_sm90 && ./selftest_fwd_sm90 [--no-bench]
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
#include "selftest_problem.h"
#include "selftest_util.cuh"

using namespace flashattn;
namespace st = flashattn::selftest;
using bf16 = __nv_bfloat16;

// d128 bf16, padded (B, S, H, 128) contiguous; windows as the API takes them (wr 0: causal).
struct Problem {
  int B, H, Hk, sq, sk, wl, wr;
  st::Sizes sz;
  bf16 *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  st::HostInputs host;
  FwdParams p;

  Problem(int B_, int H_, int Hk_, int sq_, int sk_, int wl_, int wr_, unsigned seed)
      : B(B_), H(H_), Hk(Hk_), sq(sq_), sk(sk_), wl(wl_), wr(wr_),
        sz(st::Sizes::padded(B_, sq_, sk_, H_, Hk_, 128, 128)) {
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
    make(&q, host.q, size_t(B) * sq * H * d);
    make(&k, host.k, size_t(B) * sk * Hk * d);
    make(&v, host.v, size_t(B) * sk * Hk * d);
    CK(cudaMalloc(&o, size_t(B) * sq * H * d * 2));
    CK(cudaMalloc(&lse, size_t(B) * H * sq * 4));
    st::Options opt;
    opt.window_left = wl;
    opt.window_right = wr;
    p = st::fwd_params(sz, {{q}, {k}, {v}, {o}, lse, nullptr, nullptr}, opt);
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
  const int d = 128;
  if (const char* why = sm90::fwd_unsupported(pr.p)) {
    std::printf("%-40s declined: %s  FAIL\n", name, why);
    return false;
  }
  CK(cudaMemset(pr.o, 0xFF, size_t(pr.B) * pr.sq * pr.H * d * 2));
  CK(cudaMemset(pr.lse, 0xFF, size_t(pr.B) * pr.H * pr.sq * 4));
  run(pr.p);
  CK(cudaDeviceSynchronize());
  std::vector<bf16> go(size_t(pr.B) * pr.sq * pr.H * d);
  std::vector<float> gl(size_t(pr.B) * pr.H * pr.sq);
  CK(cudaMemcpy(go.data(), pr.o, go.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gl.data(), pr.lse, gl.size() * 4, cudaMemcpyDeviceToHost));
  // Both laid out as the kernel writes them: out (B * sq, H, d), lse (B, H, sq).
  const st::Reference ref = st::reference(pr.sz, pr.p, pr.host, false);
  st::ErrStats eo;
  double err_l = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < gl.size(); ++i) st::check_lse(gl[i], ref.lse[i], err_l, bad);
  for (size_t i = 0; i < go.size(); ++i) eo.add(__bfloat162float(go[i]), ref.out[i]);
  bad += eo.nonfinite;
  const double rel_o = eo.max_err / std::max(eo.max_ref, 1e-6);
  const bool ok = bad == 0 && rel_o < 1e-2 && err_l < 1e-3;
  std::printf("%-40s out %.2e lse %.2e nonfinite %d  %s\n", name, rel_o, err_l, int(bad),
              ok ? "ok" : "FAIL");
  return ok;
}


template <int kSchedule>
static void run90(const FwdParams& p) { sm90::launch_fwd_sm90<bf16, kSchedule>(p, nullptr); }
static const char* kScheduleNames[] = {"", "overlap", "ping-pong"};

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
    std::printf("[%-9s] ", kScheduleNames[1]);
    failed += !check(pr, c.name, [](const FwdParams& p) { run90<1>(p); });
    std::printf("[%-9s] ", kScheduleNames[2]);
    failed += !check(pr, c.name, [](const FwdParams& p) { run90<2>(p); });
    n += 2;
  }
  std::printf("seed %u: %d of %d cases failed\n", seed, failed, n);
  if (!bench) return failed ? 1 : 0;
  std::printf("\nTFLOP/s, d128 bf16, B*N = 16k, H = 16 (sm80: our portable kernel)\n");
  std::printf("%-6s %-6s %10s %10s %10s %8s\n", "N", "causal", "overlap", "ping-pong", "sm80",
              "best/80");
  for (int N : {1024, 2048, 4096, 8192, 16384})
    for (int causal = 0; causal < 2; ++causal) {
      Problem pr(16384 / N, 16, 16, N, N, -1, causal ? 0 : -1, 1);
      const double f = pr.flops() * 1e-9;
      const double t1 = median_ms([&] { run90<1>(pr.p); });
      const double t2 = median_ms([&] { run90<2>(pr.p); });
      const double t80 = median_ms([&] { sm80::run_fwd(pr.p, nullptr); });
      std::printf("%-6d %-6d %10.1f %10.1f %10.1f %8.2f\n", N, causal, f / t1, f / t2, f / t80,
                  t80 / std::min(t1, t2));
    }
  return failed ? 1 : 0;
}
