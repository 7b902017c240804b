// Hopper (sm_90a) building blocks: mbarriers, TMA tile loads, WGMMA shared-memory descriptors,
// named barriers, WGMMA sequencing (the MMAs themselves: wgmma_sm90.h, generated). Checked on
// the H200 by tools/selftest/probe_sm90.cu (a TMA + WGMMA S = Q K^T, O = P V tile against a CPU reference).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../common/device_utils.cuh"
#include "wgmma_sm90.h"

namespace flashattn::sm90 {

// ---- mbarrier (one 64-bit word in shared memory) ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
// Makes initialised barriers visible to the async (TMA) proxy; then a CTA barrier.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// A 32-bit load from shared memory by address (volatile: kept after the mbarrier wait, an
// asm volatile, that publishes what it reads; no memory clobber, so it pins nothing else).
__device__ __forceinline__ int ld_shared_s32(uint32_t addr) {
  int v;
  asm volatile("ld.shared.s32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
// Spins until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// ---- TMA: a 2-D box (inner coordinate first) from global into shared, completing on `bar` ----
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tmap, uint64_t* bar, int c0,
                                            int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_u32(dst)),
      "l"(tmap), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}
// A 3-D box (d, row, head) of a packed varlen (total, heads, d) tensor.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* tmap, uint64_t* bar, int c0,
                                            int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_u32(dst)),
      "l"(tmap), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// A 4-D box (d, row, head, batch) of a (batch, seqlen, heads, d) tensor.
__device__ __forceinline__ void tma_load_4d(void* dst, const void* tmap, uint64_t* bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_u32(dst)),
      "l"(tmap), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Register budget of the calling warpgroup (needs a register cap at kernel entry:
// __launch_bounds__(threads, 1)); the producer gives registers to the consumers.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Named barriers (ids 1..15; 0 is __syncthreads): `threads` counts the arrivals of both sides
// (a multiple of 32). sync waits for them; arrive counts this warp's and goes on.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// 2^x by the SFU alone (ex2.approx.ftz: one MUFU, subnormals flushed; exp2f adds range
// fix-ups around it). 2^-inf = +0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^x on the FMA and integer units instead of the SFU (FA4's trick, for the share of the
// softmax's exponentials moved off MUFU): x = j + f by the 1.5 * 2^23 rounding trick (j an
// integer, |f| <= 0.5), 2^f by a degree-3 polynomial (max rel. error 1.0e-4, under half a bf16 /
// fp16 ulp), 2^j added to its exponent bits. Below -125 (masked scores: -inf) it gives 0, as
// ex2.approx.ftz does, so a row with no visible key keeps a zero sum.
__device__ __forceinline__ float exp2_fma(float x) {
  const float xc = fmaxf(x, -125.f);
  const float t = xc + 12582912.f, j = t - 12582912.f, f = xc - j;
  const float p = fmaf(fmaf(fmaf(0.0550085739f, f, 0.242210337f), f, 0.693282896f), f, 1.f);
  const float y = __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));
  return x < -125.f ? 0.f : y;
}

// Ordinary shared-memory stores that the tensor cores or TMA read next: in each writing
// thread, before the CTA barrier.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Global memory between the generic and the async proxy (a TMA reduce-add ordered after an
// acquire, or its completed writes before a release).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// ---- WGMMA shared-memory matrix descriptors, 128-byte swizzle (the TMA SWIZZLE_128B layout:
// rows of 128 bytes, 8-row atoms of 1024 bytes, atoms 1024-byte aligned) ----
// K-major (A, or B = K^T): sbo = bytes between 8-row groups (1024 for packed rows); the K
// step of 16 elements within a 128-byte row moves start by 32 bytes.
// MN-major (B = V): lbo = bytes between 64-element column chunks, sbo = bytes between
// 8-row (K) groups.
// kSwizzle: the rows' bytes, 128 (the layout above) or 64 (TMA SWIZZLE_64B: 8-row atoms of 512
// bytes; the FP8 forward's 64-byte rows).
template <int kSwizzle>
__device__ __forceinline__ uint64_t gmma_desc_swz(uint32_t smem_addr, uint32_t lbo_bytes,
                                                  uint32_t sbo_bytes) {
  static_assert(kSwizzle == 128 || kSwizzle == 64, "the 128- or 64-byte swizzle");
  uint64_t desc = 0;
  desc |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  desc |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t(kSwizzle == 128 ? 1 : 2) << 62;  // the layout type: 1 128-byte, 2 64-byte
  return desc;
}
__device__ __forceinline__ uint64_t gmma_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                    uint32_t sbo_bytes) {
  return gmma_desc_swz<128>(smem_addr, lbo_bytes, sbo_bytes);
}
// A WGMMA descriptor moved `bytes` on in shared memory: the start-address field is the low 14
// bits (address / 16) and shared addresses stay below 256 KB, so a plain add cannot carry out.
__device__ __forceinline__ uint64_t desc_add(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// Two floats as the 16-bit pair (bf16 or fp16) of one WGMMA A-operand register (lo in the
// low half).
template <typename Element>
__device__ __forceinline__ uint32_t pack_x2(float lo, float hi) {
  static_assert(std::is_same_v<Element, __nv_bfloat16> || std::is_same_v<Element, __half>,
                "WGMMA operands are bf16 or fp16");
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Four floats as four e4m3 (x0 in the low byte), rounded to nearest and saturated to +-448 (the
// FP8 forward's P, in [0, 256]): one e4m3 A-operand register of a k32 WGMMA.
__device__ __forceinline__ uint32_t pack_e4m3_x4(float x0, float x1, float x2, float x3) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"  // (upper, lower) = (x1, x0)
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}"
      : "=r"(r)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return r;
}

// ---- warpgroup MMA sequencing ----
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the async MMAs.
template <int kN>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace flashattn::sm90
