// fp16 / bf16 <-> fp32 bit conversions (no compiler or torch half types), and the
// typed row loads and stores the kernels use. Rounding to fp16/bf16 is to nearest even.
#pragma once
#include <cstdint>
#include <cstring>

#include "../common/params.h"

namespace flashattn::cpu {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Exact: every fp16 value is an fp32 value. Subnormals are normalised with integer ops so
// that a denormals-are-zero FPU mode cannot flush them.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_f32(sign);
  const int shift = __builtin_clz(mant) - 21;  // brings the leading 1 to bit 10
  mant = (mant << shift) & 0x3ffu;
  return bits_f32(sign | (static_cast<uint32_t>(113 - shift) << 23) | (mant << 13));
}

// Round to nearest even; overflow gives inf, nan stays a (quiet) nan.
inline uint16_t float_to_half(float f) {
  uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint32_t o;
  if (u >= 0x47800000u) {  // >= 65536 (or inf / nan)
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // below fp16's smallest normal: the fp32 adder rounds
    // Adding 0.5 aligns the fp16 subnormal's bits at the bottom of the mantissa; the
    // hardware add does the round-to-nearest-even.
    const float magic = bits_f32(126u << 23);
    o = f32_bits(bits_f32(u) + magic) - (126u << 23);
  } else {
    const uint32_t odd = (u >> 13) & 1u;
    u += 0xc8000fffu + odd;  // rebias the exponent (-112 << 23) and round half to even
    o = u >> 13;             // a carry into the exponent gives the next binade or inf
  }
  return static_cast<uint16_t>(o | sign);
}

inline float bf16_to_float(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// float8_e4m3fn -> fp32, exact: S.EEEE.MMM with exponent bias 7, subnormals (E = 0) m * 2^-9
// (normal fp32 values: no flush-to-zero mode can touch them), no infinities, S.1111.111 NaN.
inline float e4m3_to_float(uint8_t x) {
  const uint32_t sign = static_cast<uint32_t>(x & 0x80u) << 24;
  const uint32_t exp = (x >> 3) & 0xfu, mant = x & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return bits_f32(sign | 0x7fc00000u);
  if (exp != 0) return bits_f32(sign | ((exp + 120u) << 23) | (mant << 20));
  return bits_f32(sign | f32_bits(static_cast<float>(mant) * 0.001953125f));  // m * 2^-9
}

// Element access by dtype (the dtype is a template parameter of every kernel).
template <DType kDt>
struct Elem;
template <>
struct Elem<DType::kFloat32> {
  using T = float;
  static float load(T x) { return x; }
  static T store(float x) { return x; }
};
template <>
struct Elem<DType::kFloat16> {
  using T = uint16_t;
  static float load(T x) { return half_to_float(x); }
  static T store(float x) { return float_to_half(x); }
};
template <>
struct Elem<DType::kBFloat16> {
  using T = uint16_t;
  static float load(T x) { return bf16_to_float(x); }
  static T store(float x) { return float_to_bf16(x); }
};

// FP8 inputs only (no FP8 output: out is bf16 / fp16, params.h).
template <>
struct Elem<DType::kFloat8E4M3> {
  using T = uint8_t;
  static float load(T x) { return e4m3_to_float(x); }
};

// dst[0, n) = src[0, n) as fp32, dst[n, n_pad) = 0.
template <DType kDt>
inline void load_row(const typename Elem<kDt>::T* src, int n, int n_pad, float* dst) {
  if constexpr (kDt == DType::kFloat32) {
    std::memcpy(dst, src, sizeof(float) * n);
  } else {
    for (int i = 0; i < n; ++i) dst[i] = Elem<kDt>::load(src[i]);
  }
  for (int i = n; i < n_pad; ++i) dst[i] = 0.f;
}

// dst[0, n) = src[0, n) * scale, rounded once to the dtype.
template <DType kDt>
inline void store_row(const float* src, int n, float scale, typename Elem<kDt>::T* dst) {
  for (int i = 0; i < n; ++i) dst[i] = Elem<kDt>::store(src[i] * scale);
}

}  // namespace flashattn::cpu
