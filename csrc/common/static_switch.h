// Static switches: a runtime value becomes a compile-time constant inside one dispatch
// function per direction. Host code only.
#pragma once
#include <stdexcept>
#include <string>

#include "params.h"
#include "tile_policy.h"

// Calls M(D) for every head-dim bucket of tile_policy.h (for extern template lists).
#define FLASHATTN_FOR_EACH_HEADDIM(M) M(32) M(64) M(96) M(128) M(192) M(256)
static_assert(flashattn::kNumHeadDimBuckets == 6 && flashattn::kHeadDimBuckets[0] == 32 &&
                  flashattn::kHeadDimBuckets[5] == 256,
              "FLASHATTN_FOR_EACH_HEADDIM / FLASHATTN_HEADDIM_SWITCH must list kHeadDimBuckets");

// The head-dim buckets this build compiled, a bitmask over kHeadDimBuckets (setup.py passes
// it from the developer switch FLASHATTN_HEADDIMS; default all).
#ifndef FLASHATTN_HEADDIM_MASK
#define FLASHATTN_HEADDIM_MASK 0x3f
#endif
namespace flashattn {
constexpr bool headdim_built(int bucket) {
  for (int i = 0; i < kNumHeadDimBuckets; ++i)
    if (kHeadDimBuckets[i] == bucket) return (FLASHATTN_HEADDIM_MASK >> i) & 1;
  return false;
}
}  // namespace flashattn

// A bucket left out of the build throws; its instantiation is then never referenced.
#define FLASHATTN_HEADDIM_CASE_(D, WHAT, ...)                                                \
  case D: {                                                                                 \
    constexpr int kHeadDim = D;                                                             \
    if constexpr (::flashattn::headdim_built(D)) {                                          \
      return __VA_ARGS__();                                                                 \
    } else {                                                                                \
      throw std::runtime_error(std::string(WHAT) + ": head dim bucket " #D " was left out " \
                               "of this build (FLASHATTN_HEADDIMS)");                       \
    }                                                                                       \
  }

// BUCKET (a headdim_bucket() value) -> `constexpr int kHeadDim` in the lambda body.
#define FLASHATTN_HEADDIM_SWITCH(BUCKET, WHAT, ...)                                        \
  [&] {                                                                                    \
    switch (BUCKET) {                                                                      \
      FLASHATTN_HEADDIM_CASE_(32, WHAT, __VA_ARGS__)                                       \
      FLASHATTN_HEADDIM_CASE_(64, WHAT, __VA_ARGS__)                                       \
      FLASHATTN_HEADDIM_CASE_(96, WHAT, __VA_ARGS__)                                       \
      FLASHATTN_HEADDIM_CASE_(128, WHAT, __VA_ARGS__)                                      \
      FLASHATTN_HEADDIM_CASE_(192, WHAT, __VA_ARGS__)                                      \
      FLASHATTN_HEADDIM_CASE_(256, WHAT, __VA_ARGS__)                                      \
      default:                                                                             \
        throw std::runtime_error(std::string(WHAT) + ": no kernel for head-dim bucket " + \
                                 std::to_string(BUCKET));                                  \
    }                                                                                      \
  }()

// DTYPE (a flashattn::DType) -> `using Element = __half / __nv_bfloat16` in the lambda body.
#define FLASHATTN_FP16_SWITCH(DTYPE, WHAT, ...)                                           \
  [&] {                                                                                   \
    if ((DTYPE) == ::flashattn::DType::kFloat16) {                                        \
      using Element = __half;                                                             \
      return __VA_ARGS__();                                                               \
    }                                                                                     \
    if ((DTYPE) == ::flashattn::DType::kBFloat16) {                                       \
      using Element = __nv_bfloat16;                                                      \
      return __VA_ARGS__();                                                               \
    }                                                                                     \
    throw std::runtime_error(std::string(WHAT) + ": dtype must be float16 or bfloat16"); \
  }()
