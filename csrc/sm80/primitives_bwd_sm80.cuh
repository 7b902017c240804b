// Extra register-level primitives for the sm80 backward (the shared ones live in
// primitives_sm80.cuh). Each is a thin wrapper over the PTX named in its comment.
#pragma once
#include <cstdint>
#include "primitives_sm80.cuh"

// In bwd_detail so that names the forward later adds to primitives_sm80.cuh can't clash.
namespace flashattn::sm80::bwd_detail {

// cp.async.cg.shared.global [dst], [src], 16, src_bytes: the bytes past src_bytes are
// zero-filled (head-dim tails); src must be 16-byte aligned even when src_bytes < 16.
__device__ __forceinline__ void cp_async_16_n(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// ex2.approx.ftz.f32: 2^x, ex2(-inf) = +0 (the masked-entry path relies on it).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// tanh.approx.f32 (sm75+): the softcap's tanh, max rel. error ~2^-11 (as flash-attn).
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two fp32 atomic adds to consecutive addresses: red.global.add.v2.f32 on sm90
// (one L2 transaction), two red.global.add.f32 before. addr must be 8-byte aligned.
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b)
               : "memory");
#else
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// stmatrix.sync.aligned.m8n8.x4.shared.b16 (sm90): r[i] is this lane's fragment of 8x8
// matrix i (the mma C / ldmatrix layout); lane l gives the address of row l % 8 of matrix
// l / 8 (16 bytes).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
#endif

// Ordered-accumulation semaphore (deterministic mode). One thread spins with
// ld.acquire.gpu until the counter reaches `value` (then a CTA barrier); the release is one
// thread's red.release.gpu after a CTA barrier, cumulative over what the CTA wrote before
// the barrier (the pattern of CUTLASS's Semaphore::release).
__device__ __forceinline__ void sem_wait(const int* sem, int value) {
  int v;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
  } while (v != value);
}
__device__ __forceinline__ void sem_release(int* sem) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(sem) : "memory");
}

// Swizzled offset (in elements) of element (row, col) of a row-major smem tile with
// kCols columns. 16-byte chunks are XOR-permuted so that the 8 rows an ldmatrix reads at
// one logical chunk hit 8 distinct bank groups: chunk ^ (row % 8) within groups of 8 when
// a row holds a multiple of 8 chunks; for 4 or 12 chunks (d = 32, 96) two rows share a
// 128-byte line, so chunk ^ ((row / 2) % 4) within groups of 4.
template <int kCols>
__device__ __forceinline__ int swz(int row, int col) {
  constexpr int kChunks = kCols / 8;
  static_assert(kCols % 32 == 0, "swizzled tiles need a multiple of 32 columns");
  constexpr int kGroup = (kChunks % 8 == 0) ? 8 : 4;
  const int c = col >> 3;
  const int x = (kGroup == 8) ? (row & 7) : ((row >> 1) & 3);
  const int pc = (c & ~(kGroup - 1)) | ((c ^ x) & (kGroup - 1));
  return row * kCols + pc * 8 + (col & 7);
}

// A lane's ldmatrix address pattern in a swizzled tile: (row_l + R, col_l + C) for
// compile-time R (multiple of 8) and C (multiple of 16). When col_l's chunk is 0 or 1 plus
// a multiple of the swizzle group (kFold), the XOR distributes over C, so each address is
// (base ^ imm) + imm and one register per distinct XOR covers every step of a GEMM loop;
// otherwise the full swizzle is recomputed (the compiler hoists one value per C).
template <int kCols, bool kFold>
struct SwzLane {
  static constexpr int kGroup = ((kCols / 8) % 8 == 0) ? 8 : 4;
  int row_l, col_l, base;
  __device__ __forceinline__ SwzLane(int row, int col)
      : row_l(row), col_l(col), base(swz<kCols>(row, col)) {}
  __device__ __forceinline__ int at(int R, int C) const {
    if constexpr (kFold) {
      const int cc = C >> 3;
      return (base ^ ((cc & (kGroup - 1)) << 3)) + R * kCols + ((cc & ~(kGroup - 1)) << 3);
    } else {
      return swz<kCols>(row_l + R, col_l + C);
    }
  }
};
template <int kCols>
inline constexpr int kSwzGroupCols = (((kCols / 8) % 8 == 0) ? 8 : 4) * 8;
// SwzLane may fold for a warp tile kTileCols wide (lanes at chunk 0 / 1, 16-column steps) if
// it covers whole swizzle groups, or its T = kTileCols / 8 chunks are a power of two <= the
// group: lane chunk + step < T then never carries into the tile's start bits.
template <int kCols, int kTileCols>
inline constexpr bool kSwzFold =
    kTileCols % kSwzGroupCols<kCols> == 0 ||
    ((kTileCols / 8) > 1 && ((kTileCols / 8) & (kTileCols / 8 - 1)) == 0 &&
     kTileCols <= kSwzGroupCols<kCols>);

}  // namespace flashattn::sm80::bwd_detail
