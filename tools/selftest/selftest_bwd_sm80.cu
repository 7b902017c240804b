// Standalone self-test of the sm80 backward (no torch): random inputs, the float64 CPU
// reference forward + backward (params and reference: selftest_problem.h), max relative
// errors of dq / dk / dv, a NaN-poisoned output check, a determinism check, and timings.
// Links the bf16 instantiations:
//   A="-std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -I csrc"
//   for d in 32 64 96 128 192 256; do
//     nvcc $A -c csrc/instantiations/bwd_sm80_hdim${d}_bf16.cu -o h$d.o & done
//   nvcc $A -c tools/selftest/selftest_bwd_sm80.cu -o st.o; wait
//   nvcc $A st.o h*.o -o selftest_bwd && ./selftest_bwd [--bench [d256]]
// With -DSELFTEST_SM90 (and sm_90a for this file): --sm90 runs the Hopper backward's main
// kernel (csrc/sm90/kernel_bwd_sm90.cuh) between the sm80
// preprocessing and conversions on the cases they take; --sm90 --bench then times each beside
// the sm80 backward (tools/device/sm90_bwd_selftest.sh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "sm80/launch_bwd_sm80.cuh"
#ifdef SELFTEST_SM90
#include "sm90/launch_bwd_sm90.cuh"
#ifdef SELFTEST_D256
#include "sm90/launch_bwd_d256_sm90.cuh"
#endif
#endif
#include "selftest_problem.h"
#include "selftest_util.cuh"

using namespace flashattn;
namespace st = flashattn::selftest;
using bf16 = __nv_bfloat16;

namespace flashattn::sm80 {
extern template void run_bwd_hdim<32, __nv_bfloat16>(const BwdParams&, cudaStream_t);
extern template void run_bwd_hdim<64, __nv_bfloat16>(const BwdParams&, cudaStream_t);
extern template void run_bwd_hdim<96, __nv_bfloat16>(const BwdParams&, cudaStream_t);
extern template void run_bwd_hdim<192, __nv_bfloat16>(const BwdParams&, cudaStream_t);
extern template void run_bwd_hdim<128, __nv_bfloat16>(const BwdParams&, cudaStream_t);
extern template void run_bwd_hdim<256, __nv_bfloat16>(const BwdParams&, cudaStream_t);
}  // namespace flashattn::sm80

// Laid out for 16-row blocks: room for any tile shape the self-test times (run_tile).
static sm80::BwdWorkspaceLayout generous_layout(const BwdParams& p) {
  return sm80::bwd_workspace_layout(p, headdim_bucket(p.headdim, p.headdim_v), 16, 16);
}
static BwdWorkspaceSizes workspace(const BwdParams& p) {
  const sm80::BwdWorkspaceLayout w = generous_layout(p);
  return BwdWorkspaceSizes{w.f32_elems, w.i32_elems};
}


struct Case {
  std::string name;
  int B, H, Hk, d, dv;
  std::vector<int> lq, lk;  // per-sequence lengths; varlen when `varlen`
  bool varlen = false;
  int wl = -1, wr = -1;
  float softcap = 0.f;
  bool alibi = false;
  bool deterministic = false;
  int det_chunk = 0;  // > 0: FLASHATTN_BWD_DET_CHUNK (rotation chunks of that many key blocks)
};

static float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

// -DSELFTEST_ONLY_64_128: link only the d64 / d128 instantiations (quick A/B builds); the
// cases of other buckets are skipped. With -DSELFTEST_D256 too: and the d256 one (the sm90
// d 256 draft's preprocessing and conversions).
#if defined(SELFTEST_ONLY_64_128) && defined(SELFTEST_D256)
static bool bucket_built(int bucket) { return bucket == 64 || bucket == 128 || bucket == 256; }
#elif defined(SELFTEST_ONLY_64_128)
static bool bucket_built(int bucket) { return bucket == 64 || bucket == 128; }
#else
static bool bucket_built(int) { return true; }
#endif

static void run_kernel(const BwdParams& p) {
  const int bucket = headdim_bucket(p.headdim, p.headdim_v);
  if (bucket == 64) sm80::run_bwd_hdim<64, bf16>(p, 0);
  else if (bucket == 128) sm80::run_bwd_hdim<128, bf16>(p, 0);
#if !defined(SELFTEST_ONLY_64_128) || defined(SELFTEST_D256)
  else if (bucket == 256) sm80::run_bwd_hdim<256, bf16>(p, 0);
#endif
#ifndef SELFTEST_ONLY_64_128
  else if (bucket == 32) sm80::run_bwd_hdim<32, bf16>(p, 0);
  else if (bucket == 96) sm80::run_bwd_hdim<96, bf16>(p, 0);
  else if (bucket == 192) sm80::run_bwd_hdim<192, bf16>(p, 0);
#endif
  else { std::printf("bucket %d not compiled in the self-test\n", bucket); std::exit(1); }
}

// The backward entry the cases and timings use (run_kernel, or one tile shape for A/B runs).
static void (*g_runner)(const BwdParams&) = run_kernel;
template <typename Tile, bool kHeavyFirst = false>
static void run_tile(const BwdParams& p) {
  sm80::run_bwd_tile<Tile, bf16>(p, 0, generous_layout(p), kHeavyFirst);
}

#ifdef SELFTEST_SM90
// The sm90 main kernels for buckets 64 and 128 (kD is the accumulators' row length), each run
// between the sm80 preprocessing and conversions: the package's (kernel_bwd_sm90.cuh) and
// timing-only ablations of it. (The first draft it replaced, 0.45-0.6x sm80 where this one is
// 1.7-1.9x, is in git history: 2473d07.)
template <class Cfg, sm90::BwdOrder kOrder>
static void sm90_main(const sm80::BwdArgs& args, cudaStream_t s) {
  sm90::launch_bwd_main_sm90<Cfg, bf16>(args, s, kOrder);
}
#ifdef SELFTEST_D256
// The d 256 draft (kernel_bwd_d256_sm90.cuh), whatever the variant asks (it has no ablations).
template <sm90::BwdOrder kOrder>
static void sm90_main_d256(const sm80::BwdArgs& args, cudaStream_t s) {
  sm90::launch_bwd_main_d256_sm90<bf16>(args, s, kOrder);
}
#endif
template <template <int> class CfgFor, sm90::BwdOrder kOrder = sm90::BwdOrder::kAuto>
static void run_sm90(const BwdParams& p) {
  const int bucket = headdim_bucket(p.headdim, p.headdim_v);
#ifdef SELFTEST_D256
  if (bucket == 256) {
    sm80::run_bwd_tile<sm80::BwdTileFor<256>::type, bf16>(p, 0, generous_layout(p), false,
                                                           sm90_main_d256<kOrder>);
    return;
  }
#endif
  if (bucket == 64)
    sm80::run_bwd_tile<sm80::BwdTileFor<64>::type, bf16>(p, 0, generous_layout(p), false,
                                                          sm90_main<CfgFor<64>, kOrder>);
  else
    sm80::run_bwd_tile<sm80::BwdTileFor<128>::type, bf16>(p, 0, generous_layout(p), false,
                                                           sm90_main<CfgFor<128>, kOrder>);
}
template <int kD>
using Sm90NoDqAdd = sm90::BwdConfig<kD, sm90::BwdConfigFor<kD>::kBM, 1>;
template <int kD>
using Sm90NoExp = sm90::BwdConfig<kD, sm90::BwdConfigFor<kD>::kBM, 2>;
template <int kD>
using Sm90NoSwap = sm90::BwdConfig<kD, sm90::BwdConfigFor<kD>::kBM, 3>;
template <int kD>
using Sm90DvLate = sm90::BwdConfig<kD, sm90::BwdConfigFor<kD>::kBM, 4>;
struct Sm90Variant {
  const char* name;
  void (*run)(const BwdParams&);
  bool checked;  // ablations give wrong numbers by design: timed only
};
static const Sm90Variant kSm90Variants[] = {
    {"sm90      ", run_sm90<sm90::BwdConfigFor>, true},
    {"sm90 noDQ ", run_sm90<Sm90NoDqAdd>, false},  // no dQ reduce-adds: prices the dQ traffic
    {"sm90 noEXP", run_sm90<Sm90NoExp>, false},    // P = S, no mask: prices the softmax side
    // Correct variants for A/Bs: the dQ staging's old (bank-conflicting) order; dV after dS^T.
    {"sm90 noSWP", run_sm90<Sm90NoSwap>, true},
    {"sm90 dvLat", run_sm90<Sm90DvLate>, true},
    // The candidate in the per-pair launch order (the same launch unless causal: timed causal).
    {"sm90 perhd", run_sm90<sm90::BwdConfigFor, sm90::BwdOrder::kPerHead>, false},
};
// Beyond selftest_cases(): many query and key blocks, unmasked blocks between masked ones.
static std::vector<Case> sm90_extra_cases() {
  return {
      {"d64 1000/1000", 1, 2, 2, 64, 64, {1000}, {1000}},
      {"causal d64 1000/1000", 1, 2, 2, 64, 64, {1000}, {1000}, false, -1, 0},
      {"causal d128 1000/1100 gqa 4/2", 1, 4, 2, 128, 128, {1000}, {1100}, false, -1, 0},
      {"window(100,50) d128 700/700", 1, 2, 2, 128, 128, {700}, {700}, false, 100, 50},
      {"window(0,200) d64 900/600", 2, 2, 2, 64, 64, {900, 900}, {600, 600}, false, 0, 200},
      {"varlen d128 {513,0,1000,64}/{640,1,777,64}", 4, 2, 2, 128, 128, {513, 0, 1000, 64},
       {640, 1, 777, 64}, true},
      {"varlen causal d64 {700,129,1}/{300,700,128}", 3, 2, 1, 64, 64, {700, 129, 1},
       {300, 700, 128}, true, -1, 0},
      // d 256 (the draft under -DSELFTEST_D256): partial key / query blocks, causal, GQA,
      // a window, varlen with an empty sequence, d 200 (columns past the head dim).
      {"d256 333/517", 1, 2, 2, 256, 256, {333}, {517}},
      {"causal d256 700/650 gqa 4/2", 1, 4, 2, 256, 256, {700}, {650}, false, -1, 0},
      {"window(90,30) d256 400/400", 2, 2, 1, 256, 256, {400, 400}, {400, 400}, false, 90, 30},
      {"varlen d256 {300,0,129}/{200,64,300}", 3, 2, 2, 256, 256, {300, 0, 129}, {200, 64, 300},
       true},
      {"d200 250/190", 1, 2, 2, 200, 200, {250}, {190}},
  };
}
#endif

static std::vector<bf16> to_bf(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16(x[i]);
  return y;
}
template <typename T>
static T* dev(const std::vector<T>& x) {
  T* p;
  CK(cudaMalloc(&p, std::max<size_t>(1, x.size()) * sizeof(T)));
  CK(cudaMemcpy(p, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

struct DevRun {
  std::vector<uint16_t> dq, dk, dv;
};

// Runs the kernel with freshly NaN-poisoned outputs and a zeroed workspace.
static DevRun launch(BwdParams p, size_t nq, size_t nk, size_t nv) {
  bf16 *dq, *dk, *dv;
  CK(cudaMalloc(&dq, nq * 2)); CK(cudaMalloc(&dk, nk * 2)); CK(cudaMalloc(&dv, nv * 2));
  CK(cudaMemset(dq, 0xff, nq * 2)); CK(cudaMemset(dk, 0xff, nk * 2));
  CK(cudaMemset(dv, 0xff, nv * 2));
  p.dq_ptr = dq; p.dk_ptr = dk; p.dv_ptr = dv;
  BwdWorkspaceSizes ws = workspace(p);
  float* wf; int32_t* wi;
  CK(cudaMalloc(&wf, std::max<int64_t>(1, ws.f32_elems) * 4));
  CK(cudaMalloc(&wi, std::max<int64_t>(1, ws.i32_elems) * 4));
  CK(cudaMemset(wf, 0, std::max<int64_t>(1, ws.f32_elems) * 4));
  CK(cudaMemset(wi, 0, std::max<int64_t>(1, ws.i32_elems) * 4));
  p.workspace_f32 = wf; p.workspace_f32_elems = ws.f32_elems;
  p.workspace_i32 = wi; p.workspace_i32_elems = ws.i32_elems;
  g_runner(p);
  CK(cudaDeviceSynchronize());
  DevRun r;
  r.dq.resize(nq); r.dk.resize(nk); r.dv.resize(nv);
  CK(cudaMemcpy(r.dq.data(), dq, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r.dk.data(), dk, nk * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r.dv.data(), dv, nv * 2, cudaMemcpyDeviceToHost));
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(wf); cudaFree(wi);
  return r;
}

// max |a - ref| / max |ref|; counts non-finite outputs.
static double rel_err(const std::vector<uint16_t>& a, const std::vector<double>& ref, int* bad) {
  st::ErrStats e;
  for (size_t i = 0; i < a.size(); ++i) e.add(to_float(a[i], false), ref[i]);
  *bad += int(e.nonfinite);
  return e.rel();
}

static bool run_case(const Case& c, std::mt19937& rng) {
  const int B = c.B, H = c.H, Hk = c.Hk, d = c.d, dv = c.dv;
  int maxq = 0, maxk = 0;
  for (int b = 0; b < B; ++b) {
    maxq = std::max(maxq, c.lq[b]);
    maxk = std::max(maxk, c.lk[b]);
  }
  for (int b = 0; b < B; ++b)
    if (!c.varlen && (c.lq[b] != maxq || c.lk[b] != maxk)) {
      std::printf("%-34s FAIL  padded case with unequal lengths\n", c.name.c_str());
      return false;
    }
  const st::Sizes sz = c.varlen ? st::Sizes::packed(c.lq, c.lk, H, Hk, d, dv)
                                : st::Sizes::padded(B, maxq, maxk, H, Hk, d, dv);
  const int64_t tq = sz.total_q(), tk = sz.total_k();
  std::normal_distribution<float> nd(0.f, 1.f);
  st::HostInputs t;
  auto fill = [&](std::vector<float>& x, size_t n) {
    x.resize(n);
    for (auto& e : x) e = bf(nd(rng));
  };
  fill(t.q, size_t(tq) * H * d); fill(t.k, size_t(tk) * Hk * d);
  fill(t.v, size_t(tk) * Hk * dv); fill(t.dout, size_t(tq) * H * dv);
  std::vector<float> slopes(B * H, 0.f);
  if (c.alibi) {
    for (auto& s : slopes) s = std::uniform_real_distribution<float>(0.f, 0.3f)(rng);
    t.alibi_slopes = slopes;
  }

  st::Options opt;
  opt.window_left = c.wl;
  opt.window_right = c.wr;
  opt.softcap = c.softcap;
  if (c.alibi) { opt.alibi_slopes = dev(slopes); opt.alibi_batch_stride = H; }
  opt.deterministic = c.deterministic;
  st::BwdTensors dt;
  dt.q.ptr = dev(to_bf(t.q)); dt.k.ptr = dev(to_bf(t.k)); dt.v.ptr = dev(to_bf(t.v));
  dt.dout.ptr = dev(to_bf(t.dout));
  CK(cudaMalloc(&dt.lse, std::max<int64_t>(1, tq * H) * 4));
  CK(cudaMalloc(&dt.dsoftmax_sum, std::max<int64_t>(1, tq * H) * 4));
  if (c.varlen) {
    dt.cu_seqlens_q = dev(sz.cu_q);
    dt.cu_seqlens_k = dev(sz.cu_k);
  }
  // The forward's out (rounded to bf16) and lse come from the reference. dq / dk / dv: launch().
  bf16* o_dev;
  CK(cudaMalloc(&o_dev, std::max<int64_t>(1, tq * H * dv) * 2));
  dt.out.ptr = o_dev;
  const BwdParams p = st::bwd_params(sz, dt, opt);
  const st::Reference ref = st::reference(sz, p, t, true);
  std::vector<float> o(ref.out.begin(), ref.out.end()), lse(ref.lse.begin(), ref.lse.end());
  const std::vector<bf16> o_bf = to_bf(o);
  CK(cudaMemcpy(o_dev, o_bf.data(), o_bf.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dt.lse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
  if (c.det_chunk > 0) setenv("FLASHATTN_BWD_DET_CHUNK", std::to_string(c.det_chunk).c_str(), 1);
  else unsetenv("FLASHATTN_BWD_DET_CHUNK");

  DevRun r = launch(p, t.q.size(), t.k.size(), t.v.size());
  int bad = 0;
  const double eq = rel_err(r.dq, ref.dq, &bad), ek = rel_err(r.dk, ref.dk, &bad),
               ev = rel_err(r.dv, ref.dv, &bad);
  bool same = true;
  if (c.deterministic) {
    for (int rep = 0; rep < 3; ++rep) {
      DevRun r2 = launch(p, t.q.size(), t.k.size(), t.v.size());
      same = same && r2.dq == r.dq && r2.dk == r.dk && r2.dv == r.dv;
    }
  }
  const bool ok = bad == 0 && eq < 2e-2 && ek < 2e-2 && ev < 2e-2 && same;
  std::printf("%-34s dq %.2e dk %.2e dv %.2e nonfinite %d%s  %s\n", c.name.c_str(), eq, ek, ev,
              bad, c.deterministic ? (same ? " bitwise-same" : " DIFFERS") : "",
              ok ? "ok" : "FAIL");
  return ok;
}

// Median time of the backward (all kernels) over `iters` runs, in ms.
static void bench(int d, int N, bool causal, bool deterministic) {
  const int B = std::max(1, 16384 / N), H = 2048 / d;
  const size_t nq = size_t(B) * N * H * d;
  std::vector<bf16> hx(nq);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& e : hx) e = __float2bfloat16(nd(rng));
  bf16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  for (bf16** ptr : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) {
    CK(cudaMalloc(ptr, nq * 2));
    CK(cudaMemcpy(*ptr, hx.data(), nq * 2, cudaMemcpyHostToDevice));
  }
  float *lse, *dsum;
  std::vector<float> hl(size_t(B) * H * N, 12.f);
  CK(cudaMalloc(&lse, hl.size() * 4)); CK(cudaMalloc(&dsum, hl.size() * 4));
  CK(cudaMemcpy(lse, hl.data(), hl.size() * 4, cudaMemcpyHostToDevice));
  st::Options opt;
  opt.causal = causal;
  opt.deterministic = deterministic;
  st::BwdTensors t;
  t.q.ptr = q; t.k.ptr = k; t.v.ptr = v; t.out.ptr = o; t.lse = lse;
  t.dout.ptr = dout; t.dq.ptr = dq; t.dk.ptr = dk; t.dv.ptr = dv; t.dsoftmax_sum = dsum;
  BwdParams p = st::bwd_params(st::Sizes::padded(B, N, N, H, H, d, d), t, opt);
  BwdWorkspaceSizes ws = workspace(p);
  float* wf; int32_t* wi;
  CK(cudaMalloc(&wf, std::max<int64_t>(1, ws.f32_elems) * 4));
  CK(cudaMalloc(&wi, std::max<int64_t>(1, ws.i32_elems) * 4));
  p.workspace_f32 = wf; p.workspace_f32_elems = ws.f32_elems;
  p.workspace_i32 = wi; p.workspace_i32_elems = ws.i32_elems;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<float> times;
  for (int it = 0; it < 13; ++it) {
    // The API zeroes the workspace on every call: include that in the timing.
    CK(cudaEventRecord(e0));
    CK(cudaMemsetAsync(wf, 0, std::max<int64_t>(1, ws.f32_elems) * 4));
    CK(cudaMemsetAsync(wi, 0, std::max<int64_t>(1, ws.i32_elems) * 4));
    g_runner(p);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 3) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  const double ms = times[times.size() / 2];
  const double flops = 2.5 * 4.0 * B * H * double(N) * N * d * (causal ? 0.5 : 1.0);
  std::printf("bench d=%d N=%5d B=%2d H=%2d causal=%d det=%d: %.3f ms  %.1f TFLOP/s\n", d, N,
              B, H, int(causal), int(deterministic), ms, flops / ms * 1e-9);
  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)dout, (void*)dq, (void*)dk,
                    (void*)dv, (void*)lse, (void*)dsum, (void*)wf, (void*)wi})
    cudaFree(ptr);
}

static std::vector<Case> selftest_cases() {
  return {
      {"basic d64 256/256", 2, 2, 2, 64, 64, {256, 256}, {256, 256}},
      {"d128 113/203", 1, 2, 2, 128, 128, {113}, {203}},
      {"causal d128 113/203", 1, 2, 2, 128, 128, {113}, {203}, false, -1, 0},
      {"causal d64 203/113", 1, 2, 2, 64, 64, {203}, {113}, false, -1, 0},
      {"causal d64 1/239", 1, 2, 2, 64, 64, {1}, {239}, false, -1, 0},
      {"window(31,7) d64 300/260", 1, 2, 2, 64, 64, {300}, {260}, false, 31, 7},
      {"softcap+alibi d128 190/190", 1, 2, 2, 128, 128, {190}, {190}, false, -1, -1, 5.f, true},
      {"causal softcap alibi d64 77/333", 2, 2, 2, 64, 64, {77, 77}, {333, 333}, false, -1, 0,
       3.f, true},
      {"gqa 4/2 causal d64 200/200", 1, 4, 2, 64, 64, {200}, {200}, false, -1, 0},
      {"mqa 4/1 d128 150/170", 1, 4, 1, 128, 128, {150}, {170}},
      {"d40 dv64 (dv != d) 130/97", 1, 2, 2, 40, 64, {130}, {97}},
      {"d60 unaligned 130/97 causal", 1, 2, 2, 60, 60, {130}, {97}, false, -1, 0},
      {"d33 dv17 unaligned 70/90", 1, 3, 3, 33, 17, {70}, {90}},
      {"varlen d64 {100,0,260}/{90,5,300}", 3, 2, 2, 64, 64, {100, 0, 260}, {90, 5, 300}, true},
      {"varlen causal gqa d128", 3, 4, 2, 128, 128, {100, 33, 260}, {190, 33, 200}, true, -1,
       0},
      {"det causal d128 300/300", 1, 2, 2, 128, 128, {300}, {300}, false, -1, 0, 0.f, false,
       true},
      {"det causal d128 1000/1000", 1, 2, 2, 128, 128, {1000}, {1000}, false, -1, 0, 0.f,
       false, true},
      {"det causal gqa d128 777/1100", 1, 4, 2, 128, 128, {777}, {1100}, false, -1, 0, 0.f,
       false, true},
      {"det causal d128 1100/777", 2, 2, 2, 128, 128, {1100, 1100}, {777, 777}, false, -1, 0,
       0.f, false, true},
      {"det window(-1,100) d128 500/450", 1, 2, 2, 128, 128, {500}, {450}, false, -1, 100, 0.f,
       false, true},
      {"det varlen causal d128", 3, 2, 2, 128, 128, {600, 1, 900}, {700, 129, 300}, true, -1, 0,
       0.f, false, true},
      {"det gqa window d64 333/400", 2, 4, 2, 64, 64, {333, 333}, {400, 400}, false, 50, 20,
       0.f, false, true},
      {"det varlen mqa d64", 2, 4, 1, 64, 64, {257, 130}, {300, 129}, true, -1, 0, 0.f, false,
       true},
      {"det d128 1000/900 chunks of 3", 1, 2, 2, 128, 128, {1000}, {900}, false, -1, -1, 0.f,
       false, true, 3},
      {"det varlen gqa d64 chunks of 2", 3, 4, 2, 64, 64, {300, 40, 500}, {700, 64, 200}, true,
       -1, -1, 0.f, false, true, 2},
      {"d32 gqa causal 100/150", 2, 4, 1, 32, 32, {100, 100}, {150, 150}, false, -1, 0},
      {"d80 window alibi 180/170", 1, 2, 2, 80, 80, {180}, {170}, false, 20, 30, 0.f, true},
      {"varlen d96 softcap", 2, 2, 2, 96, 96, {70, 190}, {130, 64}, true, -1, -1, 2.f},
      {"d192 causal 140/260", 1, 2, 2, 192, 192, {140}, {260}, false, -1, 0},
      {"det d160 dv192 gqa 190/170", 1, 4, 2, 160, 192, {190}, {170}, false, -1, -1, 0.f,
       false, true},
      {"d256 causal 150/190", 1, 2, 2, 256, 256, {150}, {190}, false, -1, 0},
      {"d200 dv256 window softcap 170/130", 1, 2, 1, 200, 256, {170}, {130}, false, 40, 10, 4.f},
      {"det d256 causal gqa 200/200", 1, 4, 2, 256, 256, {200}, {200}, false, -1, 0, 0.f,
       false, true},
  };
}

int main(int argc, char** argv) {
  // --one d N causal det: time one cell only (for a profiler).
  // --tiles: the package's tiles below d256, each checked on the cases of its bucket, then
  // timed: d64 / d128 per head against heavy-first (the package's order), and the <= 99 KB
  // tiles for sm_86 / sm_89 (BwdTileSmallSmem, in the package's order). d256 has none: one
  // Q / dO stage and 4 warps spill 500 B (128 dK / dV registers); FA2 keeps V in registers.
  // d64 32 x 256 (P^T in registers) was measured slower (benchmarks/NOTES.md) and dropped.
  if (argc == 2 && std::string(argv[1]) == "--tiles") {
    struct Cand { const char* name; int d; void (*run)(const BwdParams&); };
    const Cand cands[] = {
        {"d64 128x128 per head", 64, run_tile<sm80::BwdTileFor<64>::type>},
        {"d64 128x128 heavy-first", 64, run_tile<sm80::BwdTileFor<64>::type, true>},
        {"d64 64x128 small smem", 64, run_tile<sm80::BwdTileSmallSmem<64>::type, true>},
        {"d128 64x128 per head", 128, run_tile<sm80::BwdTileFor<128>::type>},
        {"d128 64x128 heavy-first", 128, run_tile<sm80::BwdTileFor<128>::type, true>},
        {"d128 32x64 small smem", 128, run_tile<sm80::BwdTileSmallSmem<128>::type, true>},
        {"d32 64x128 small smem", 32, run_tile<sm80::BwdTileSmallSmem<32>::type, true>},
        {"d96 64x64 small smem", 96, run_tile<sm80::BwdTileSmallSmem<96>::type, true>},
        {"d192 32x32 w4 small smem", 192, run_tile<sm80::BwdTileSmallSmem<192>::type, true>},
    };
    const unsigned seed = std::random_device{}();
    std::mt19937 rng(seed);
    int fails = 0;
    for (const Cand& c : cands) {
      g_runner = c.run;
      int ran = 0, bad = 0;
      for (const Case& k : selftest_cases())
        if (headdim_bucket(k.d, k.dv) == c.d) { bad += !run_case(k, rng); ++ran; }
      std::printf("== %s: %d of %d cases failed\n", c.name, bad, ran);
      fails += bad;
      for (int N : {2048, 8192, 16384})
        for (bool causal : {false, true}) { std::printf("%s: ", c.name); bench(c.d, N, causal, false); }
      std::printf("%s: ", c.name); bench(c.d, 4096, true, true);
    }
    return fails != 0;
  }
#ifndef SELFTEST_ONLY_64_128
  // --tiles256: d256 causal (BwdTileLargeSmem), launch order per head (the package's below 2k
  // keys) against heavy-first (from 2k keys).
  if (argc == 2 && std::string(argv[1]) == "--tiles256") {
    using L = sm80::BwdTileLargeSmem<256>::type;
    for (int N : {512, 1024, 2048, 8192}) {
      g_runner = run_tile<L, false>;
      std::printf("per head:    "); bench(256, N, true, false);
      g_runner = run_tile<L, true>;
      std::printf("heavy-first: "); bench(256, N, true, false);
    }
    return 0;
  }
#endif
#ifdef SELFTEST_SM90
  // --sm90 [--bench] [--small]: every checked sm90 variant on the cases it takes (deterministic
  // ones run non-deterministic: their shapes still count), then with --bench each variant timed
  // beside sm80. --small (for the sanitizers): the candidate alone, on cases of at most 2^20
  // scores.
  if (argc >= 2 && std::string(argv[1]) == "--sm90") {
    bool do_bench = false, small = false;
    for (int a = 2; a < argc; ++a) {
      do_bench = do_bench || std::string(argv[a]) == "--bench";
      small = small || std::string(argv[a]) == "--small";
    }
    const unsigned seed = std::random_device{}();
    std::printf("seed %u (sm90 main kernels)\n", seed);
    std::mt19937 rng(seed);
    int fails = 0, ran = 0;
    std::vector<Case> cases = selftest_cases();
    for (const Case& c : sm90_extra_cases()) cases.push_back(c);
    for (const Sm90Variant& v : kSm90Variants) {
      if (!v.checked || (small && &v != &kSm90Variants[0])) continue;
      for (Case c : cases) {
        if (c.softcap != 0.f || c.alibi || c.d % 8 || c.dv % 8) continue;  // not taken yet
        int64_t scores = 0;
        for (int b = 0; b < c.B; ++b) scores += int64_t(c.lq[b]) * c.lk[b] * c.H;
        if (small && scores > (int64_t(1) << 20)) continue;
        const int bucket = headdim_bucket(c.d, c.dv);
        if (bucket != 64 && bucket != 128 && !(bucket == 256 && bucket_built(256))) continue;
        c.deterministic = false;
        c.det_chunk = 0;
        g_runner = v.run;
        c.name = "[" + std::string(v.name) + "] " + c.name;
        fails += !run_case(c, rng);
        ++ran;
      }
    }
    std::printf("%d of %d sm90 cases failed\n", fails, ran);
    if (do_bench) {
      std::printf("bench rows: sm90 (the package's), sm90 noDQ (the candidate without "
                  "its dQ reduce-adds: timing only), sm90 noEXP (no exp2 / mask: timing only), sm90 "
                  "noSWP (the dQ staging in its old, bank-conflicting order), sm90 dvLat (dV after "
                  "dS^T), sm90 perhd (causal: the candidate in the per-head launch order), sm80\n");
      for (int d : {64, 128, 256})
        for (int N : {2048, 8192, 16384})
          for (bool causal : {false, true}) {
            if (!bucket_built(d)) continue;
            for (const Sm90Variant& v : kSm90Variants) {
              if (d == 256 && &v != &kSm90Variants[0]) continue;  // the draft alone
              if (!causal && v.run == run_sm90<sm90::BwdConfigFor, sm90::BwdOrder::kPerHead>)
                continue;
              g_runner = v.run;
              std::printf("%s ", v.name);
              bench(d, N, causal, false);
            }
            g_runner = run_kernel;
            std::printf("sm80       ");
            bench(d, N, causal, false);
          }
    }
    return fails != 0;
  }
#endif
  if (argc == 6 && std::string(argv[1]) == "--one") {
    bench(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]) != 0, std::atoi(argv[5]) != 0);
    return 0;
  }
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const std::vector<Case> cases = selftest_cases();
  int fails = 0;
  int ran = 0;
  for (const Case& c : cases) {
    if (!bucket_built(headdim_bucket(c.d, c.dv))) continue;
    fails += !run_case(c, rng);
    ++ran;
  }
  std::printf("%d of %d cases failed\n", fails, ran);
  if (argc > 1 && std::string(argv[1]) == "--bench") {
    for (int d : {64, 128})
      for (int N : {2048, 8192})
        for (bool causal : {false, true}) bench(d, N, causal, false);
    if (argc > 2 && bucket_built(256))
      for (bool causal : {false, true}) bench(256, 4096, causal, false);
    for (int d : {64, 128})
      for (bool causal : {false, true}) {
        bench(d, 4096, causal, false);
        bench(d, 4096, causal, true);
      }
  }
  return fails != 0;
}
