// Standalone self-test and timer of the sm80 forward (no torch): random inputs for a set of
// shapes and features, flashattn::sm80::run_fwd against the float64 CPU reference (params and
// reference: selftest_problem.h), poisoned outputs (NaN) and guard zones to catch unwritten or
// out-of-bounds elements; then TFLOP/s over the benchmark grid (bf16, hidden 2048,
// B = 16384 / N).
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

#include "common/params.h"
#include "sm80/launch_fwd_sm80.cuh"
#include "sm80/sm80_backend.h"
#include "selftest_problem.h"
#include "selftest_util.cuh"

using flashattn::DType;
using flashattn::FwdParams;
namespace st = flashattn::selftest;

namespace {

constexpr uint16_t kPoison = 0xFFFF;  // NaN in fp16 and bf16
constexpr int64_t kGuard = 4096;      // elements of poison after every buffer

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
  st::DevTensor tensor() const { return {dev + off, ld}; }
  // The first `dim` columns as float, contiguous (rows, H, dim): the reference's layout.
  std::vector<float> values(int dim, bool fp16) {
    std::vector<float> x(size_t(rows) * H * dim);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int c = 0; c < dim; ++c) x[(r * H + h) * dim + c] = to_float(at(r, h, c), fp16);
    return x;
  }
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
  const st::Sizes sz = c.varlen ? st::Sizes::packed(lq, lk, c.H, c.Hk, c.d, c.dv)
                                : st::Sizes::padded(c.B, c.Sq, c.Sk, c.H, c.Hk, c.d, c.dv);
  const int64_t rq = sz.total_q(), rk = sz.total_k();
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
    CK(cudaMemcpy(cuq_d, sz.cu_q.data(), (c.B + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(cuk_d, sz.cu_k.data(), (c.B + 1) * 4, cudaMemcpyHostToDevice));
  }

  st::Options opt;
  opt.dtype = fp16 ? DType::kFloat16 : DType::kBFloat16;
  opt.causal = c.causal;
  opt.window_left = c.wl;
  opt.window_right = c.wr;
  opt.softcap = c.softcap;
  opt.alibi_slopes = slopes_d;  // (nheads,): batch stride 0
  const FwdParams p = st::fwd_params(
      sz, {q.tensor(), k.tensor(), v.tensor(), o.tensor(), lse_d, cuq_d, cuk_d}, opt);
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
  st::HostInputs in{q.values(c.d, fp16), k.values(c.d, fp16), v.values(c.dv, fp16), {}, {}};
  if (c.alibi) in.alibi_slopes = slopes;
  const st::Reference ref = st::reference(sz, p, in, false);
  st::ErrStats err;
  double lse_err = 0;
  int64_t bad = 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < lq[b]; ++i) {
        const int64_t l = st::lse_offset(p, sz, b, h, i), row = sz.cu_q[b] + i;
        st::check_lse(lse[l], ref.lse[l], lse_err, bad);
        for (int e = 0; e < c.dv; ++e)
          err.add(to_float(o.at(row, h, e), fp16), ref.out[(row * c.H + h) * c.dv + e]);
      }
  bad += err.nonfinite;
  const double max_err = err.max_err, max_ref = err.max_ref;
  // Nothing written outside the valid region: row padding, rows of no sequence, guards.
  int64_t stray = 0;
  std::vector<char> valid_row(o.rows, 0);
  for (int b = 0; b < c.B; ++b)
    for (int i = 0; i < lq[b]; ++i) valid_row[sz.cu_q[b] + i] = 1;
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
    st::Options opt;
    opt.causal = causal;
    p = st::fwd_params(st::Sizes::padded(B, N, N, H, H, d, d),
                       {{q}, {k}, {v}, {o}, lse, nullptr, nullptr}, opt);
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

// The tiles and launch orders the package chooses between, timed side by side (same cells,
// same process). Shapes measured slower and dropped (d256 64 x 32, d256 with two K/V stages):
// benchmarks/NOTES.md and git history.
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

constexpr bool same_tile(flashattn::sm80::FwdTile a, int bm, int bn, int w, int s, int mb) {
  return a.block_m == bm && a.block_n == bn && a.warps == w && a.stages == s && a.min_blocks == mb;
}
static_assert(same_tile(flashattn::sm80::fwd_tile(64), 128, 128, 4, 2, 2) &&
                  same_tile(flashattn::sm80::fwd_tile(128), 128, 64, 4, 2, 2) &&
                  same_tile(flashattn::sm80::fwd_tile(256), 128, 64, 8, 1, 1) &&
                  same_tile(flashattn::sm80::fwd_tile_small_smem(256), 64, 64, 4, 1, 2),
              "--variants times the tiles of tile_fwd_sm80.h: update it with them");

void bench_variants() {
  // d256 at small N: 128 x 64 (8 warps) against 64 x 64 (4 warps, 2 CTAs/SM; the package's
  // up to 2k keys, heavy-first from 1k queries), each per head and heavy-first.
  for (int N : {512, 1024, 2048})
    for (int causal = 0; causal < 2; ++causal) {
      Cell c(256, N, causal);
      std::printf("d256 N %d causal %d\n", N, causal);
      variant<256, 128, 64, 8, 1, 1>(c);
      variant<256, 128, 64, 8, 1, 1>(c, true);
      variant<256, 64, 64, 4, 1, 2>(c);
      variant<256, 64, 64, 4, 1, 2>(c, true);
    }
  // d64 / d128 causal: per head against heavy-first (the package's order).
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
  // d128: two K/V stages (the package's) against one (tied at N = 2k, tile_fwd_sm80.h).
  for (int N : {2048, 8192})
    for (int causal = 0; causal < 2; ++causal) {
      Cell c(128, N, causal);
      std::printf("d128 N %d causal %d\n", N, causal);
      variant<128, 128, 64, 4, 2, 2>(c);
      variant<128, 128, 64, 4, 1, 2>(c);
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
