// Hopper (sm_90a) building blocks: mbarriers, TMA tile loads, WGMMA shared-memory descriptors,
// named barriers and the warpgroup MMAs the forward uses. Checked on the H200 by
// tools/selftest/probe_sm90.cu (a TMA + WGMMA S = Q K^T, O = P V tile against a CPU reference).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../common/device_utils.cuh"

// The 64 fp32 accumulator registers of an m64n128 WGMMA: their names in the PTX template
// (operands %0..%63) and the matching read-write operand list.
#define FLASHATTN_WGMMA_D64_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FLASHATTN_WGMMA_D64_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
  "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
  "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), \
  "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
  "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
  "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
  "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), \
  "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
  "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

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

// Ordinary shared-memory stores that the tensor cores or TMA read next: in each writing
// thread, before the CTA barrier.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- WGMMA shared-memory matrix descriptors, 128-byte swizzle (the TMA SWIZZLE_128B layout:
// rows of 128 bytes, 8-row atoms of 1024 bytes, atoms 1024-byte aligned) ----
// K-major (A, or B = K^T): sbo = bytes between 8-row groups (1024 for packed rows); the K
// step of 16 elements within a 128-byte row moves start by 32 bytes.
// MN-major (B = V): lbo = bytes between 64-element column chunks, sbo = bytes between
// 8-row (K) groups.
__device__ __forceinline__ uint64_t gmma_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                    uint32_t sbo_bytes) {
  uint64_t desc = 0;
  desc |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  desc |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t(1) << 62;  // 128-byte swizzle
  return desc;
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

// D (64 x 128, fp32) (+)= A (64 x 16, smem, K-major) * B (128 x 16, smem; K-major, or N-major
// when kTransB), A and B bf16 or fp16 (Element). scale_d = 0: D = A * B.
#define FLASHATTN_WGMMA_SS(TYPES)                                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES                           \
               " {" FLASHATTN_WGMMA_D64_REGS "}, %64, %65, p, 1, 1, 0, %67;\n}\n"             \
               : FLASHATTN_WGMMA_D64_OPERANDS(d)                                              \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(int(kTransB)))
template <bool kTransB, typename Element>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) FLASHATTN_WGMMA_SS("bf16.bf16");
  else FLASHATTN_WGMMA_SS("f16.f16");
}
#undef FLASHATTN_WGMMA_SS

// The same with A (64 x 16, bf16) in registers: the accumulator layout of a previous GEMM
// (rows warp * 16 + lane / 4 (+8), column pairs (lane % 4) * 2), packed two per register.
#define FLASHATTN_WGMMA_RS(TYPES)                                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES                           \
               " {" FLASHATTN_WGMMA_D64_REGS "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
               : FLASHATTN_WGMMA_D64_OPERANDS(d)                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d),     \
                 "n"(int(kTransB)))
template <bool kTransB, typename Element>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int scale_d) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) FLASHATTN_WGMMA_RS("bf16.bf16");
  else FLASHATTN_WGMMA_RS("f16.f16");
}
#undef FLASHATTN_WGMMA_RS

}  // namespace flashattn::sm90
