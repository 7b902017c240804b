// Hopper building blocks of the backward (and the forward's epilogue) beyond primitives_sm90.cuh:
// shared-memory accesses by 32-bit address (always STS / LDS, never the generic ST.E a lost
// address space gives; stmatrix for the FP8 forward's on-chip V^T), bulk reduce-adds
// into global fp32 (1-D and TMA-tensor), the TMA store, their bulk-group waits, and WGMMA
// descriptor offsets. Each documents the PTX it emits.
#pragma once
#include <cstdint>

#include "primitives_sm90.cuh"

namespace flashattn::sm90 {

// st.shared.b32 / st.shared.v2.f32 / ld.shared.v2.f32 at a shared-window address.
__device__ __forceinline__ void sts_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void sts_f32x2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void sts_f32(uint32_t addr, float a) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(a) : "memory");
}
__device__ __forceinline__ float2 lds_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// stmatrix.sync.aligned.m8n8.x4.shared.b16: four 8 x 8 b16 matrices, row addresses from lanes
// 8 m .. 8 m + 7 for matrix m; row i of matrix m is register m of lanes 4 i .. 4 i + 3 (16 bytes,
// lane 4 i first, each register's low half first).
__device__ __forceinline__ void stsm_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                        uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// cp.reduce.async.bulk (1-D): `bytes` (a multiple of 16) of fp32 in shared memory added into
// global memory, in this thread's bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const void* src, int bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
      "r"(smem_u32(src)), "r"(bytes)
      : "memory");
}
// cp.reduce.async.bulk.tensor: one box of an fp32 tensor map (the layout the map's swizzle
// gives in shared memory) added into global memory; parts of the box past the tensor's
// extents are not written. In this thread's bulk group.
__device__ __forceinline__ void tma_reduce_add_3d(const void* tmap, uint32_t src, int c0, int c1,
                                                  int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4}], [%1];" ::"l"(tmap),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_reduce_add_4d(const void* tmap, uint32_t src, int c0, int c1,
                                                  int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];" ::"l"(tmap),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// cp.async.bulk.tensor (store): one box of a 16-bit tensor map (the map's swizzled layout in
// shared memory) written to global memory, parts past the tensor's extents not written; in
// this thread's bulk group (the forward's epilogue, kernel_fwd_sm90.cuh).
__device__ __forceinline__ void tma_store_4d(const void* tmap, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];" ::"l"(tmap),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Until at most kPending of this thread's bulk groups still read their shared sources.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
// Until at most kPending of this thread's bulk groups are incomplete (writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

// (desc_add, the descriptor offset, is in primitives_sm90.cuh with the descriptors.)

}  // namespace flashattn::sm90
