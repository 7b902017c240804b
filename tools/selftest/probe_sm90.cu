// Probe of the sm90 building blocks (csrc/sm90/primitives_sm90.cuh) on one attention tile:
// TMA loads (128-byte swizzle, completing on an mbarrier) of Q (64 x 128), K and V (128 x 128)
// bf16; S = Q K^T by WGMMA from shared memory (both K-major); P = bf16(S / 16) kept in
// registers as the A operand of O = P V (V N-major, the transposed-B descriptor). Both
// checked against float64 CPU products (plain GEMMs: not selftest_problem.h's attention
// reference). No torch. On the H200:
//   A="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I csrc"
//   nvcc $A tools/selftest/probe_sm90.cu -o probe_sm90 && ./probe_sm90
#include <cuda.h>  // CUtensorMap and its enums (types only: no libcuda to link)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "sm90/primitives_sm90.cuh"
#include "selftest_util.cuh"

using namespace flashattn::sm90;
using flashattn::smem_u32;
using bf16 = __nv_bfloat16;


constexpr int kM = 64, kN = 128, kD = 128;
// Shared memory, 1024-byte aligned: Q as two 64-column halves (64 rows x 128 B each), K and
// V likewise (128 rows x 128 B each), then the barrier.
constexpr int kQHalf = kM * 64, kKVHalf = kN * 64;  // elements
constexpr int kOffK = 2 * kQHalf * 2, kOffV = kOffK + 2 * kKVHalf * 2;
constexpr int kOffBar = kOffV + 2 * kKVHalf * 2;
constexpr int kSmem = kOffBar + 16 + 1024;  // + alignment slack
constexpr uint32_t kTxBytes = kOffBar;      // every byte of Q, K and V

// Stores a 64 x 128 accumulator (the m64n128 layout) row-major.
__device__ void store_acc(const float (&d)[64], float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int c = j * 8 + (lane % 4) * 2;
    out[r0 * 128 + c] = d[j * 4 + 0];
    out[r0 * 128 + c + 1] = d[j * 4 + 1];
    out[(r0 + 8) * 128 + c] = d[j * 4 + 2];
    out[(r0 + 8) * 128 + c + 1] = d[j * 4 + 3];
  }
}

__global__ void __launch_bounds__(128, 1)
    probe_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                 const __grid_constant__ CUtensorMap tv, float* s_out, float* o_out) {
  extern __shared__ uint8_t raw[];
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  bf16* sq = reinterpret_cast<bf16*>(base);
  bf16* sk = reinterpret_cast<bf16*>(base + kOffK);
  bf16* sv = reinterpret_cast<bf16*>(base + kOffV);
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + kOffBar);
  const int tid = threadIdx.x;
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect_tx(bar, kTxBytes);
    for (int h = 0; h < 2; ++h) {
      tma_load_2d(sq + h * kQHalf, &tq, bar, h * 64, 0);
      tma_load_2d(sk + h * kKVHalf, &tk, bar, h * 64, 0);
      tma_load_2d(sv + h * kKVHalf, &tv, bar, h * 64, 0);
    }
  }
  mbar_wait(bar, 0);

  // S = Q K^T: 8 K-steps of 16; step kk reads half kk / 4 at byte (kk % 4) * 32 of each row.
  float s[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t col = (kk % 4) * 32;
    const uint64_t da = gmma_desc_sw128(smem_u32(sq + (kk / 4) * kQHalf) + col, 16, 1024);
    const uint64_t db = gmma_desc_sw128(smem_u32(sk + (kk / 4) * kKVHalf) + col, 16, 1024);
    wgmma_ss<false, __nv_bfloat16>(s, da, db, kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(s);
  store_acc(s, s_out);

  // O = P V, P from registers: K-step kk takes S's n8 blocks 2 kk and 2 kk + 1; V's rows
  // 16 kk.. (1024 bytes per 8 rows), its two 64-column halves kKVHalf * 2 bytes apart.
  // All of P converted before the MMAs read it (else the compiler fences every step).
  uint32_t pa[kN / 16][4];
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    const int j0 = 2 * kk, j1 = 2 * kk + 1;
    const float sc = 1.f / 16.f;
    pa[kk][0] = pack_x2<__nv_bfloat16>(s[j0 * 4] * sc, s[j0 * 4 + 1] * sc);
    pa[kk][1] = pack_x2<__nv_bfloat16>(s[j0 * 4 + 2] * sc, s[j0 * 4 + 3] * sc);
    pa[kk][2] = pack_x2<__nv_bfloat16>(s[j1 * 4] * sc, s[j1 * 4 + 1] * sc);
    pa[kk][3] = pack_x2<__nv_bfloat16>(s[j1 * 4 + 2] * sc, s[j1 * 4 + 3] * sc);
  }
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    const uint64_t db = gmma_desc_sw128(smem_u32(sv) + kk * 16 * 128, kKVHalf * 2, 1024);
    wgmma_rs<true, __nv_bfloat16>(o, pa[kk], db, 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(o);
  store_acc(o, o_out);
}

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                      &q));
  if (fn == nullptr || q != cudaDriverEntryPointSuccess) {
    std::printf("cuTensorMapEncodeTiled not found\n");
    std::exit(1);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// A row-major [rows][128] bf16 matrix, loaded as boxes of 64 columns x `rows` rows.
static CUtensorMap make_map(const bf16* ptr, int rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(kD), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(kD) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(rows)}, estr[2] = {1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(ptr),
                                 dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed: %d\n", int(r));
    std::exit(1);
  }
  return m;
}

static double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 0, err = 0;
  for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::fabs(want[i]));
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::isfinite(got[i]) ? std::fabs(got[i] - want[i]) : 1e30;
    err = std::max(err, e);
  }
  return err / scale;
}

static void print_corner(const char* name, const std::vector<float>& got,
                         const std::vector<double>& want) {
  std::printf("%s [0..2][0..3] got / want:\n", name);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c)
      std::printf("  %9.4f/%9.4f", got[r * 128 + c], want[r * 128 + c]);
    std::printf("\n");
  }
}

int main() {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](std::vector<bf16>& v, std::vector<float>& f, size_t n) {
    v.resize(n);
    f.resize(n);
    for (size_t i = 0; i < n; ++i) {
      v[i] = __float2bfloat16(nd(rng));
      f[i] = __bfloat162float(v[i]);
    }
  };
  std::vector<bf16> hq, hk, hv;
  std::vector<float> fq, fk, fv;
  fill(hq, fq, kM * kD);
  fill(hk, fk, kN * kD);
  fill(hv, fv, kN * kD);
  bf16 *q, *k, *v;
  float *s, *o;
  CK(cudaMalloc(&q, hq.size() * 2));
  CK(cudaMalloc(&k, hk.size() * 2));
  CK(cudaMalloc(&v, hv.size() * 2));
  CK(cudaMalloc(&s, kM * kN * 4));
  CK(cudaMalloc(&o, kM * kD * 4));
  CK(cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(s, 0xFF, kM * kN * 4));  // NaN poison
  CK(cudaMemset(o, 0xFF, kM * kD * 4));
  const CUtensorMap tq = make_map(q, kM), tk = make_map(k, kN), tv = make_map(v, kN);
  CK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  probe_kernel<<<1, 128, kSmem>>>(tq, tk, tv, s, o);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> gs(kM * kN), go(kM * kD);
  CK(cudaMemcpy(gs.data(), s, gs.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(go.data(), o, go.size() * 4, cudaMemcpyDeviceToHost));

  std::vector<double> rs(kM * kN), ro(kM * kD, 0.0);
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      double acc = 0;
      for (int c = 0; c < kD; ++c) acc += double(fq[i * kD + c]) * fk[j * kD + c];
      rs[i * kN + j] = acc;
    }
  // P from the GPU's S (so that a rounding boundary cannot flip), rounded as the kernel does.
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      const double p = __bfloat162float(__float2bfloat16(gs[i * kN + j] * (1.f / 16.f)));
      for (int c = 0; c < kD; ++c) ro[i * kD + c] += p * fv[j * kD + c];
    }
  const double es = max_rel(gs, rs), eo = max_rel(go, ro);
  const bool ok = es < 1e-4 && eo < 1e-4;
  if (!ok) {
    print_corner("S", gs, rs);
    print_corner("O", go, ro);
  }
  std::printf("probe_sm90: S = Q K^T max rel err %.2e, O = P V max rel err %.2e: %s\n", es, eo,
              ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}
