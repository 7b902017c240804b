// Self-test of the Hopper forward (csrc/sm90/kernel_fwd_sm90.cuh), no torch, one head dim
// per binary (-DSELFTEST_D=64|128|256, default 128): every candidate shape of that head dim
// (kCandidates below) on odd shapes, padded and varlen, against the float64 CPU reference of
// selftest_problem.h (out and lse, NaN-poisoned outputs; params built as the package builds
// them), then TFLOP/s of each beside the sm80 kernel on the benchmark's cells, in the same
// process. Build and run on the H200: tools/device/sm90_fwd_ab.sh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "sm80/sm80_backend.h"
#include "sm90/launch_fwd_sm90.cuh"
#include "selftest_problem.h"
#include "selftest_util.cuh"

using namespace flashattn;
namespace st = flashattn::selftest;
using bf16 = __nv_bfloat16;

#ifndef SELFTEST_D
#define SELFTEST_D 128
#endif
constexpr int kD = SELFTEST_D;

// The shapes timed against each other: the package's (first) and the alternatives, each
// waiting for V as the package does at this head dim (fwd_v_late) unless named otherwise.
template <int kBM, int kBN, int kStages, int kSchedule, int kExpFma = 0>
using Cfg = sm90::FwdConfig<kD, kD, kBM, kBN, kStages, kSchedule, kExpFma, 0,
                            sm90::fwd_v_late(kD, kD)>;
// A shape waiting for V_j in the other order than the package's (kVLate: after issuing
// S_{j+1}, FA4's order, or before the turn), and one with the descriptors built once per
// operand and moved per k-step (kDescBase). (Lazy rescaling, tried here, measured no gain and
// is gone: benchmarks/NOTES.md, 2026-12-03.)
template <class P>
using VFlip = sm90::FwdConfig<kD, kD, P::kBM, P::kBN, P::kStages, P::kSchedule, 0, 0,
                              P::kVLate ? 0 : 1>;
template <class P>
using Desc = sm90::FwdConfig<kD, kD, P::kBM, P::kBN, P::kStages, P::kSchedule, 0, 1,
                             P::kVLate ? 1 : 0>;
struct Candidate {
  const char* name;
  void (*run)(const FwdParams&);
};
template <class C>
static void run90(const FwdParams& p) { sm90::launch_fwd_sm90<C, bf16>(p, nullptr); }
template <class C>  // one CTA per tile (the package's grid for causal / window until 2026-12-02)
static void run90_grid(const FwdParams& p) {
  sm90::launch_fwd_sm90<C, bf16>(p, nullptr, {INT64_MAX, 0, sm90::kDealSnake});
}
template <class C>  // persistent with the snake deal (the package's non-causal grid)
static void run90_persistent(const FwdParams& p) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  sm90::launch_fwd_sm90<C, bf16>(p, nullptr, {sms, 0, sm90::kDealSnake});
}
// Heads grouped so a group's K and V fit in ~24 MB of L2, query blocks longest first across
// the group (the order the package tried and gave up with the persistent snake; with one CTA
// per tile the hardware deals the tiles).
template <class C>
static void run90_grouped(const FwdParams& p) {
  const int64_t kv = std::max<int64_t>(1, int64_t(p.seqlen_k) * (p.headdim + p.headdim_v) * 2);
  sm90::launch_fwd_sm90<C, bf16>(p, nullptr, {INT64_MAX, int(std::max<int64_t>(1, (24 << 20) / kv))});
}
using sm90::kOverlap;
using sm90::kPingPong;
constexpr sm90::FwdTile kPkg = sm90::fwd_tile(kD, kD, false);
using Pkg = sm90::FwdConfigOf<kD, kD, false>;
#if SELFTEST_D == 64
static const Candidate kCandidates[] = {
    {"pkg", run90<Pkg>},
    {"pkg 1/tile", run90_grid<Pkg>},
    {"pkg snake", run90_persistent<Pkg>},
    {"pkg grouped", run90_grouped<Pkg>},
    {"pkg v early", run90<VFlip<Pkg>>},
    {"pkg desc", run90<Desc<Pkg>>},
    {"192x128 ov", run90<Cfg<192, 128, 2, kOverlap>>},
    {"128x128 pp", run90<Cfg<128, 128, 2, kPingPong>>},
    {"128x192 pp", run90<Cfg<128, 192, 2, kPingPong>>},
    {"192x128x3 pp", run90<Cfg<192, 128, 3, kPingPong>>},
    {"pkg exp 1/4 fma", run90<Cfg<192, 128, 2, kPingPong, 4>>},
    {"pkg exp 1/2 fma", run90<Cfg<192, 128, 2, kPingPong, 2>>},
};
#elif SELFTEST_D == 128
static const Candidate kCandidates[] = {
    {"pkg", run90<Pkg>},
    {"pkg 1/tile", run90_grid<Pkg>},
    {"pkg snake", run90_persistent<Pkg>},
    {"pkg grouped", run90_grouped<Pkg>},
    {"pkg v early", run90<VFlip<Pkg>>},
    {"pkg desc", run90<Desc<Pkg>>},
    {"128x128 ov", run90<Cfg<128, 128, 2, kOverlap>>},
    {"128x176 pp", run90<Cfg<128, 176, 2, kPingPong>>},
    {"128x176 v early", run90<VFlip<Cfg<128, 176, 2, kPingPong>>>},
    {"128x176 ov", run90<Cfg<128, 176, 2, kOverlap>>},
    {"128x160 pp", run90<Cfg<128, 160, 2, kPingPong>>},
    {"pkg exp 1/4 fma", run90<Cfg<128, 128, 2, kPingPong, 4>>},
};
#elif SELFTEST_D == 256
static const Candidate kCandidates[] = {
    {"pkg", run90<Pkg>},
    {"pkg 1/tile", run90_grid<Pkg>},
    {"pkg snake", run90_persistent<Pkg>},
    {"pkg grouped", run90_grouped<Pkg>},
    {"pkg v late", run90<VFlip<Pkg>>},
    {"pkg desc", run90<Desc<Pkg>>},
    {"128x80 pp", run90<Cfg<128, 80, 2, kPingPong>>},
    {"128x64 ov", run90<Cfg<128, 64, 2, kOverlap>>},
    {"128x64 pp", run90<Cfg<128, 64, 2, kPingPong>>},
};
#else
#error "SELFTEST_D: 64, 128 or 256"
#endif

// Median time of each of `runs`, timed in interleaved rounds (each round one warm-up and one
// timed call of every run, each round in its own seeded order): one after the other, the first
// candidates of a cell ran up to 10-18% faster than the same kernel later (GPU clocks after
// the slower sm80 kernel of the cell before, 2026-12-02), which no order-blind median removes;
// one order rotated kept each run behind the same neighbour (the package benchmark's sink
// column 5-10% "faster" than the same kernel without a sink, 2026-12-04: flashattn.bench).
static std::vector<double> interleaved_median_ms(const std::vector<std::function<void()>>& runs) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int n = static_cast<int>(runs.size()), rounds = 15;
  std::vector<std::vector<float>> ms(n);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(12345);
  for (int r = 0; r < rounds; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    for (const int i : order) {
      runs[i]();
      CK(cudaEventRecord(e0));
      runs[i]();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms[i].push_back(t);
    }
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::vector<double> med(n);
  for (int i = 0; i < n; ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    med[i] = ms[i][rounds / 2];
  }
  return med;
}

// bf16 (B, S, H, kD) padded or (total, H, kD) varlen, contiguous; windows as the API takes
// them (wr 0: causal).
struct Problem {
  st::Sizes sz;
  int wl, wr;
  bf16 *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  int32_t *cu_q = nullptr, *cu_k = nullptr;
  st::HostInputs host;
  FwdParams p;

  // timing_only: cheap uniform inputs, no host copy (the benchmark cells are 100M elements).
  Problem(st::Sizes sz_, int wl_, int wr_, unsigned seed, bool timing_only = false)
      : sz(std::move(sz_)), wl(wl_), wr(wr_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    uint32_t x = seed | 1;
    auto make = [&](bf16** dev, std::vector<float>& host, size_t n) {
      std::vector<bf16> b(n);
      if (!timing_only) host.resize(n);
      for (size_t i = 0; i < n; ++i) {
        if (timing_only) {
          x ^= x << 13, x ^= x >> 17, x ^= x << 5;
          b[i] = __float2bfloat16(float(x >> 8) * (2.f / 16777216.f) - 1.f);
          continue;
        }
        b[i] = __float2bfloat16(nd(rng));
        host[i] = __bfloat162float(b[i]);
      }
      CK(cudaMalloc(dev, std::max<size_t>(n, 1) * 2));
      CK(cudaMemcpy(*dev, b.data(), n * 2, cudaMemcpyHostToDevice));
    };
    const int H = sz.nheads, Hk = sz.nheads_k;
    make(&q, host.q, size_t(sz.total_q()) * H * kD);
    make(&k, host.k, size_t(sz.total_k()) * Hk * kD);
    make(&v, host.v, size_t(sz.total_k()) * Hk * kD);
    CK(cudaMalloc(&o, out_elems() * 2));
    CK(cudaMalloc(&lse, lse_elems() * 4));
    if (sz.varlen) {
      CK(cudaMalloc(&cu_q, sz.cu_q.size() * 4));
      CK(cudaMalloc(&cu_k, sz.cu_k.size() * 4));
      CK(cudaMemcpy(cu_q, sz.cu_q.data(), sz.cu_q.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(cu_k, sz.cu_k.data(), sz.cu_k.size() * 4, cudaMemcpyHostToDevice));
    }
    st::Options opt;
    opt.window_left = wl;
    opt.window_right = wr;
    p = st::fwd_params(sz, {{q}, {k}, {v}, {o}, lse, cu_q, cu_k}, opt);
  }
  ~Problem() {
    for (void* x : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)lse, (void*)cu_q, (void*)cu_k})
      cudaFree(x);
  }
  size_t out_elems() const { return size_t(sz.total_q()) * sz.nheads * kD; }
  size_t lse_elems() const { return size_t(sz.total_q()) * sz.nheads; }
  double flops() const {  // the benchmark's rule: 4 B H N^2 d, halved when causal
    double f = 0;
    for (int b = 0; b < sz.batch; ++b) f += 4.0 * sz.nheads * double(sz.lq[b]) * sz.lk[b] * kD;
    return f * (wr == 0 && wl < 0 ? 0.5 : 1.0);
  }
};

// Max error of out (relative to its max) and of lse (absolute) against float64.
static bool check(Problem& pr, const st::Reference& ref, const char* name, const Candidate& c) {
  if (const char* why = sm90::fwd_unsupported(pr.p)) {
    std::printf("%-44s declined: %s  FAIL\n", name, why);
    return false;
  }
  CK(cudaMemset(pr.o, 0xFF, pr.out_elems() * 2));
  CK(cudaMemset(pr.lse, 0xFF, pr.lse_elems() * 4));
  c.run(pr.p);
  CK(cudaDeviceSynchronize());
  std::vector<bf16> go(pr.out_elems());
  std::vector<float> gl(pr.lse_elems());
  CK(cudaMemcpy(go.data(), pr.o, go.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gl.data(), pr.lse, gl.size() * 4, cudaMemcpyDeviceToHost));
  // Both laid out as the kernel writes them: out (total_q, H, d), lse at lse_offset().
  st::ErrStats eo;
  double err_l = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < gl.size(); ++i) st::check_lse(gl[i], ref.lse[i], err_l, bad);
  for (size_t i = 0; i < go.size(); ++i) eo.add(__bfloat162float(go[i]), ref.out[i]);
  bad += eo.nonfinite;
  const double rel_o = eo.max_err / std::max(eo.max_ref, 1e-6);
  const bool ok = bad == 0 && rel_o < 1e-2 && err_l < 1e-3;
  std::printf("[%-15s] %-44s out %.2e lse %.2e nonfinite %d  %s\n", c.name, name, rel_o, err_l,
              int(bad), ok ? "ok" : "FAIL");
  return ok;
}

int main(int argc, char** argv) {
  // --no-bench: the checks only. --cold: each timed call alternates between two input sets
  // (each 256 MB, past the 50 MB L2), as benchmarks/bench_attn.py rotates its inputs.
  bool bench = true, cold = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-bench") == 0) bench = false;
    if (std::strcmp(argv[i], "--cold") == 0) cold = true;
  }
  const unsigned seed = std::random_device{}();
  using st::Sizes;
  struct Case { const char* name; Sizes sz; int wl, wr; };
  const Case cases[] = {
      {"128/128", Sizes::padded(1, 128, 128, 2, 2, kD, kD), -1, -1},
      {"gqa causal 200/333", Sizes::padded(2, 200, 333, 3, 1, kD, kD), -1, 0},
      {"causal 333/200 (rows with no key)", Sizes::padded(1, 333, 200, 2, 2, kD, kD), -1, 0},
      {"window (100, 20) 1000/1000", Sizes::padded(1, 1000, 1000, 2, 2, kD, kD), 100, 20},
      {"1/500", Sizes::padded(2, 1, 500, 4, 2, kD, kD), -1, -1},
      {"causal 700/700", Sizes::padded(1, 700, 700, 2, 2, kD, kD), -1, 0},
      {"257/1", Sizes::padded(1, 257, 1, 1, 1, kD, kD), -1, -1},
      {"mqa 1100/900 (several query blocks)", Sizes::padded(1, 1100, 900, 4, 1, kD, kD), -1, -1},
      {"left window only (50, -1) 300/400", Sizes::padded(1, 300, 400, 2, 2, kD, kD), 50, -1},
      {"no keys 100/0", Sizes::padded(2, 100, 0, 2, 1, kD, kD), -1, -1},
      {"varlen gqa (empty sequences)",
       Sizes::packed({113, 0, 1, 57, 700}, {203, 5, 239, 0, 650}, 6, 2, kD, kD), -1, -1},
      {"varlen causal", Sizes::packed({300, 64, 250}, {1000, 7, 250}, 4, 2, kD, kD), -1, 0},
  };
  int failed = 0, n = 0;
  for (const Case& c : cases) {
    Problem pr(c.sz, c.wl, c.wr, seed);
    const st::Reference ref = st::reference(pr.sz, pr.p, pr.host, false);
    for (const Candidate& cand : kCandidates) {
      failed += !check(pr, ref, c.name, cand);
      ++n;
    }
  }
  std::printf("d%d seed %u: %d of %d cases failed\n", kD, seed, failed, n);
  if (!bench) return failed ? 1 : 0;
  std::printf("\nTFLOP/s, d%d bf16, B*N = 16k, H = %d, %s L2 (pkg: %dx%d stages %d schedule %d; "
              "sm80: our portable kernel)\n%-6s %-6s", kD, 2048 / kD,
              cold ? "cold (two input sets in turn)" : "warm (one input set)", kPkg.block_m,
              kPkg.block_n, kPkg.stages, kPkg.schedule, "N", "causal");
  for (const Candidate& cand : kCandidates) std::printf(" %15s", cand.name);
  std::printf(" %8s\n", "sm80");
  for (int N : {512, 1024, 2048, 4096, 8192, 16384})
    for (int causal = 0; causal < 2; ++causal) {
      const Sizes sz = Sizes::padded(16384 / N, N, N, 2048 / kD, 2048 / kD, kD, kD);
      Problem pr(sz, -1, causal ? 0 : -1, 1, true);
      std::unique_ptr<Problem> pr2;
      if (cold) pr2 = std::make_unique<Problem>(sz, -1, causal ? 0 : -1, 2, true);
      int turn = 0;
      auto params = [&]() -> const FwdParams& { return pr2 && (turn++ & 1) ? pr2->p : pr.p; };
      const double f = pr.flops() * 1e-9;
      std::printf("%-6d %-6d", N, causal);
      std::vector<std::function<void()>> runs;
      for (const Candidate& cand : kCandidates) runs.push_back([&] { cand.run(params()); });
      runs.push_back([&] { sm80::run_fwd(params(), nullptr); });
      const std::vector<double> ms = interleaved_median_ms(runs);
      for (size_t i = 0; i < ms.size(); ++i)
        std::printf(i + 1 < ms.size() ? " %15.1f" : " %8.1f", f / ms[i]);
      std::printf("\n");
    }
  return failed ? 1 : 0;
}
