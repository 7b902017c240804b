// CUDA error checks for backends: throw std::runtime_error (the API layer turns it into
// a Python RuntimeError); never exit. Host code only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace flashattn {

inline void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("flashattn: CUDA error in ") + what + " at " + file +
                             ":" + std::to_string(line) + ": " + cudaGetErrorString(err));
  }
}

// Kernels that put heads and batch on gridDim.y / gridDim.z (at most 65535 each).
inline void check_grid_heads_batch(int64_t nheads, int64_t batch, const char* what) {
  if (nheads > 65535 || batch > 65535)
    throw std::runtime_error(std::string(what) + ": nheads (" + std::to_string(nheads) +
                             ") and the batch / number of sequences (" + std::to_string(batch) +
                             ") must be <= 65535 on CUDA");
}

// Whether a causal grid (a right window bound, no left one) of `blocks` CTAs may use the
// kernels' heavy-first launch order: its linear block index is 32-bit.
inline bool heavy_first_ok(int window_left, int window_right, int64_t blocks) {
  return window_right >= 0 && window_left < 0 && blocks <= int64_t(0x7fffffff);
}

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), made only
// when this (kernel, device) has not been given `bytes` or more before: a driver call per
// launch counts at decoding's ~30 us a call. The attribute lasts as long as the device's
// context (cudaDeviceReset would clear it; torch never resets a device).
inline cudaError_t set_max_dynamic_smem(const void* kernel, int bytes) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  static std::mutex mu;
  static std::unordered_map<const void*, int> done[64];  // per device: kernel -> bytes set
  std::unique_lock<std::mutex> lock(mu);
  if (dev >= 0 && dev < 64) {
    auto it = done[dev].find(kernel);
    if (it != done[dev].end() && it->second >= bytes) return cudaSuccess;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && dev >= 0 && dev < 64) done[dev][kernel] = bytes;
  return err;
}
template <typename... Args>
inline cudaError_t set_max_dynamic_smem(void (*kernel)(Args...), int bytes) {
  return set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace flashattn

#define FLASHATTN_CUDA_CHECK(expr) ::flashattn::cuda_check((expr), #expr, __FILE__, __LINE__)
// After every kernel launch: catches bad launch configurations without a device sync.
#define FLASHATTN_LAUNCH_CHECK() \
  ::flashattn::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

namespace flashattn {
// An attribute of the current device (shared memory opt-in, SM count, ...): asked of the
// runtime once per (device, attribute), they never change (a decode call asked 7 a call, ~0.2
// us each on an H100 under torch.profiler).
inline int current_device_attribute(cudaDeviceAttr attr) {
  int dev = 0, value = 0;
  FLASHATTN_CUDA_CHECK(cudaGetDevice(&dev));
  const int64_t key = (int64_t(dev) << 32) | static_cast<uint32_t>(attr);
  static std::mutex mu;
  static std::unordered_map<int64_t, int> known;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = known.find(key);
    if (it != known.end()) return it->second;
  }
  FLASHATTN_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, dev));
  std::lock_guard<std::mutex> lock(mu);
  known[key] = value;
  return value;
}

// `value`, capped by the environment variable `name` if set (a positive count of `unit`).
// Read on every call (tests change it).
inline int env_capped(const char* name, const char* unit, int value) {
  if (const char* env = std::getenv(name)) {
    char* end = nullptr;
    const long cap = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || cap <= 0)
      throw std::runtime_error(std::string("flashattn: ") + name +
                               " must be a positive number of " + unit + ", got '" + env + "'");
    if (cap < value) value = static_cast<int>(cap);
  }
  return value;
}

// Shared memory per block the kernels may opt in to: the device's, capped by the environment
// variable FLASHATTN_SMEM_LIMIT (bytes) if set, so that the tiles of smaller GPUs (sm_86 /
// sm_89: 99 KB) can be tested on larger ones.
inline int smem_optin_bytes() {
  return env_capped("FLASHATTN_SMEM_LIMIT", "bytes",
                    current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
}
}  // namespace flashattn
