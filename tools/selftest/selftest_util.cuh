// Shared by the standalone CUDA self-tests in tools/selftest/ (no torch): error checks,
// 16-bit conversions, timing. Their sizes, params and reference: selftest_problem.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

// The bits of an fp16 (fp16) or bf16 element, and back (round to nearest even).
inline float to_float(uint16_t x, bool fp16) {
  if (fp16) {
    __half_raw r;
    r.x = x;
    return __half2float(__half(r));
  }
  const uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t from_float(float f, bool fp16) {
  if (fp16) return __half_raw(__float2half_rn(f)).x;
  return __nv_bfloat16_raw(__float2bfloat16_rn(f)).x;
}

// Median milliseconds of 15 timed calls of f (CUDA events, default stream) after 3 warm-ups.
template <typename F>
double median_ms(F&& f) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < 15; ++i) {
    CK(cudaEventRecord(e0));
    f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return ms[7];
}
