// CUDA error checks for backends: throw std::runtime_error (the API layer turns it into
// a Python RuntimeError); never exit. Host code only.
#pragma once
#include <cuda_runtime_api.h>
#include <stdexcept>
#include <string>

namespace flashattn {

inline void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("flashattn: CUDA error in ") + what + " at " + file +
                             ":" + std::to_string(line) + ": " + cudaGetErrorString(err));
  }
}

}  // namespace flashattn

#define FLASHATTN_CUDA_CHECK(expr) ::flashattn::cuda_check((expr), #expr, __FILE__, __LINE__)
// After every kernel launch: catches bad launch configurations without a device sync.
#define FLASHATTN_LAUNCH_CHECK() \
  ::flashattn::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
