// The vector type of one instruction-set build of the CPU kernels, as GCC vector
// extensions. Included inside namespace flashattn::cpu::FLASHATTN_CPU_ISA by a kernels_*.cpp
// file after its `#pragma GCC target`; FLASHATTN_CPU_AVX512 selects 16 lanes (AVX-512F/BW/
// DQ/VL, kernels_avx512.cpp, which also sets FLASHATTN_CPU_AVX2), FLASHATTN_CPU_AVX2 8 lanes
// + FMA, otherwise 4 lanes (SSE2 on x86-64, NEON on aarch64).

#define FLASHATTN_CPU_INLINE inline __attribute__((always_inline))
#ifndef FLASHATTN_CPU_AVX512
#define FLASHATTN_CPU_AVX512 0
#endif

#if FLASHATTN_CPU_AVX512
inline constexpr int kW = 16;
#elif FLASHATTN_CPU_AVX2
inline constexpr int kW = 8;
#else
inline constexpr int kW = 4;
#endif

typedef float vf __attribute__((vector_size(kW * 4)));
typedef int32_t vi __attribute__((vector_size(kW * 4)));
// Unaligned, aliasing view of float memory.
typedef float vf_mem __attribute__((vector_size(kW * 4), aligned(4), may_alias));

FLASHATTN_CPU_INLINE vf vload(const float* p) { return *reinterpret_cast<const vf_mem*>(p); }
FLASHATTN_CPU_INLINE void vstore(float* p, vf v) { *reinterpret_cast<vf_mem*>(p) = v; }
// (Not `vf{} + x`: without -ffast-math that is a real add, 0 + -0 being +0.)
FLASHATTN_CPU_INLINE vf vbcast(float x) {
#if FLASHATTN_CPU_AVX512
  return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#elif FLASHATTN_CPU_AVX2
  return vf{x, x, x, x, x, x, x, x};
#else
  return vf{x, x, x, x};
#endif
}

FLASHATTN_CPU_INLINE vf vfma(vf a, vf b, vf c) {
#if FLASHATTN_CPU_AVX512
  return _mm512_fmadd_ps(a, b, c);
#elif FLASHATTN_CPU_AVX2
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}
// The scalar twin of vfma (a real fma exactly where vfma is one).
FLASHATTN_CPU_INLINE float sfma(float a, float b, float c) {
#if FLASHATTN_CPU_AVX2
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
// NaN in `b` propagates (maxps returns its second operand when either is NaN).
FLASHATTN_CPU_INLINE vf vmax(vf a, vf b) {
#if FLASHATTN_CPU_AVX512
  return _mm512_max_ps(a, b);
#elif FLASHATTN_CPU_AVX2
  return _mm256_max_ps(a, b);
#else
  return a > b ? a : b;
#endif
}
FLASHATTN_CPU_INLINE vf vmin(vf a, vf b) {
#if FLASHATTN_CPU_AVX512
  return _mm512_min_ps(a, b);
#elif FLASHATTN_CPU_AVX2
  return _mm256_min_ps(a, b);
#else
  return a < b ? a : b;
#endif
}
FLASHATTN_CPU_INLINE float hmax(vf v) {
#if FLASHATTN_CPU_AVX512
  // A tree (the scalar chain below is 16 dependent steps per row of every tile).
  return _mm512_reduce_max_ps(v);
#endif
  float m = v[0];
  for (int i = 1; i < kW; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
FLASHATTN_CPU_INLINE float hsum(vf v) {
#if FLASHATTN_CPU_AVX512
  return _mm512_reduce_add_ps(v);
#endif
  float s = 0.f;
  for (int i = 0; i < kW; ++i) s += v[i];
  return s;
}

// 2^x to ~2 ulp (Cephes exp2f polynomial on [-0.5, 0.5]). x < -125 (and -inf) gives exactly
// 0, which is what the masked and the empty-row paths rely on; x is <= 0 in every caller
// but the clamp at 127 keeps the exponent arithmetic in range anyway.
FLASHATTN_CPU_INLINE vf vexp2(vf x) {
  const vf xc = vmin(vbcast(127.f), vmax(vbcast(-125.f), x));
  const vf magic = vbcast(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf t = xc + magic;
  const vi n = (vi)t - (vi)magic;
  const vf f = xc - (t - magic);
  vf p = vbcast(1.535336188319500e-4f);
  p = vfma(p, f, vbcast(1.339887440266574e-3f));
  p = vfma(p, f, vbcast(9.618437357674640e-3f));
  p = vfma(p, f, vbcast(5.550332471162809e-2f));
  p = vfma(p, f, vbcast(2.402264791363012e-1f));
  p = vfma(p, f, vbcast(6.931472028550421e-1f));
  p = vfma(p, f, vbcast(1.f));
  const vf r = (vf)((vi)p + (n << 23));
  return x < vbcast(-125.f) ? vf{} : r;
}

// tanh to a few ulp: the odd Taylor polynomial below |x| = 0.5 (next term < 1e-8 relative),
// 1 - 2 / (e^2|x| + 1) with x's sign above (no cancellation there; vexp2 saturates to 1).
FLASHATTN_CPU_INLINE vf vtanh(vf x) {
  const vi sign = (vi)x & (vi{} + INT32_MIN);
  const vf ax = (vf)((vi)x ^ sign);
  const vf x2 = x * x;
  vf p = vbcast(-929569.f / 638512875.f);
  p = vfma(p, x2, vbcast(21844.f / 6081075.f));
  p = vfma(p, x2, vbcast(-1382.f / 155925.f));
  p = vfma(p, x2, vbcast(62.f / 2835.f));
  p = vfma(p, x2, vbcast(-17.f / 315.f));
  p = vfma(p, x2, vbcast(2.f / 15.f));
  p = vfma(p, x2, vbcast(-1.f / 3.f));
  const vf small = vfma(p * x2, x, x);
  const vf e = vexp2(ax * vbcast(2.f * 1.4426950408889634f));
  const vf big = (vf)((vi)(vbcast(1.f) - vbcast(2.f) / (e + vbcast(1.f))) | sign);
  return ax < vbcast(0.5f) ? small : big;
}

// load_row (convert.h) with the dtype conversion vectorised where the build allows it
// (F16C for fp16, a 16-bit shift for bf16).
template <DType kDt>
FLASHATTN_CPU_INLINE void load_row_vec(const typename Elem<kDt>::T* src, int n, int n_pad,
                                       float* dst) {
#if FLASHATTN_CPU_AVX2
  if constexpr (kDt == DType::kFloat16 || kDt == DType::kBFloat16) {
    int i = 0;
#if FLASHATTN_CPU_AVX512
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      if constexpr (kDt == DType::kFloat16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
      else
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_cvtepu16_epi32(h), 16)));
    }
#endif
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      if constexpr (kDt == DType::kFloat16)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
      else
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                      _mm256_cvtepu16_epi32(h), 16)));
    }
    for (; i < n; ++i) dst[i] = Elem<kDt>::load(src[i]);
    for (; i < n_pad; ++i) dst[i] = 0.f;
    return;
  }
#endif
  load_row<kDt>(src, n, n_pad, dst);
}

// load_row_vec times `scale`, for FP8 only: the dequantization of params.h (e4m3 -> fp32, times
// the descale), one fp32 rounding. Other dtypes ignore the scale (the API refuses descales
// there), so their loads stay exactly load_row_vec.
template <DType kDt>
FLASHATTN_CPU_INLINE void load_row_deq(const typename Elem<kDt>::T* src, int n, int n_pad,
                                       float scale, float* dst) {
  load_row_vec<kDt>(src, n, n_pad, dst);
  if constexpr (kDt == DType::kFloat8E4M3) {
    if (scale != 1.f)
      for (int i = 0; i < n; ++i) dst[i] *= scale;
  }
}

// dst[c * ld + j] = src row j, column c (fp32), for j < n, c < cols: the transposed packing
// of K (and of V in the backward). Rows are converted into `tmp` first (cols floats); FP8
// rows are dequantized with `scale` (load_row_deq).
#if FLASHATTN_CPU_AVX512
// 16 floats of src as fp32 (16-bit types converted as in load_row_vec).
template <DType kDt>
FLASHATTN_CPU_INLINE __m512 load16_f32(const typename Elem<kDt>::T* src) {
  if constexpr (kDt == DType::kFloat32) {
    return _mm512_loadu_ps(src);
  } else {  // fp16 / bf16 (FP8 never comes here)
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    if constexpr (kDt == DType::kFloat16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// r[i] = row i of a 16 x 16 block in, column i of it out (in registers: 64 shuffles).
FLASHATTN_CPU_INLINE void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // Per 128-bit lane L, r[4i + q] then holds rows 4i .. 4i + 3 of column 4L + q.
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  // Column 4L + q is lane L of r[q], r[4 + q], r[8 + q], r[12 + q]: a 4 x 4 lane transpose.
  for (int q = 0; q < 4; ++q) {
    const __m512 ab0 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88);
    const __m512 ab1 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xdd);
    const __m512 cd0 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88);
    const __m512 cd1 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xdd);
    t[q] = _mm512_shuffle_f32x4(ab0, cd0, 0x88);
    t[4 + q] = _mm512_shuffle_f32x4(ab1, cd1, 0x88);
    t[8 + q] = _mm512_shuffle_f32x4(ab0, cd0, 0xdd);
    t[12 + q] = _mm512_shuffle_f32x4(ab1, cd1, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}
#endif

template <DType kDt>
FLASHATTN_CPU_INLINE void load_transposed(const typename Elem<kDt>::T* src, int64_t row_stride,
                                          int n, int cols, float* dst, int ld, float* tmp,
                                          float scale = 1.f) {
#if FLASHATTN_CPU_AVX512
  // Whole 16 x 16 blocks in registers (a scalar loop is bound by its 4-byte loads and
  // stores); the rows past the last whole block of 16, and FP8 (its dequantization)
  // throughout, take the loop below.
  if constexpr (kDt != DType::kFloat8E4M3) {
    const int n16 = n / 16 * 16, c16 = cols / 16 * 16;
    for (int j0 = 0; j0 < n16; j0 += 16) {
      for (int c0 = 0; c0 < c16; c0 += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i) r[i] = load16_f32<kDt>(src + (j0 + i) * row_stride + c0);
        transpose16(r);
        for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + int64_t(c0 + i) * ld + j0, r[i]);
      }
      for (int c = c16; c < cols; ++c)
        for (int j = j0; j < j0 + 16; ++j)
          dst[c * ld + j] = Elem<kDt>::load(src[j * row_stride + c]);
    }
    src += n16 * row_stride;
    dst += n16;
    n -= n16;
  }
#endif
  for (int j = 0; j < n; ++j) {
    const float* row;
    if constexpr (kDt == DType::kFloat32) {
      row = src + j * row_stride;
    } else {
      load_row_deq<kDt>(src + j * row_stride, cols, cols, scale, tmp);
      row = tmp;
    }
    for (int c = 0; c < cols; ++c) dst[c * ld + j] = row[c];
  }
}
