// Register-blocked tile GEMM of the CPU kernels: C (M x N) = or += A (M x K) * B (K x N).
// B and C are row-major fp32 with N a multiple of kW (callers pad with zeros); A is read one
// scalar at a time (broadcast) through two strides, so A or A^T serve alike (P V and P^T dO).
// Included inside namespace flashattn::cpu::FLASHATTN_CPU_ISA after vec.h.

#if FLASHATTN_CPU_AVX512
// AVX-512 (32 vector registers; kernels_avx512.cpp chose the blocking by measurement): kMR x
// kNV accumulators + kNV B vectors (the broadcasts fold into the FMAs). Panels narrower than
// kNV vectors (a padded head dim of 16 or 48, a key tile of 16 .. 48) take the column tail.
inline constexpr int kMR = FLASHATTN_CPU_AVX512_MR;
inline constexpr int kNV = FLASHATTN_CPU_AVX512_NV;
static_assert(kMR * kNV + kNV <= 32, "the register tile must fit the 32 zmm registers");
static_assert(kColPad % kW == 0, "padded widths must hold whole vectors");
#else
// 6 x 2 vectors of accumulators + 2 B vectors + 1 broadcast = 15 of the 16 vector registers.
inline constexpr int kMR = 6;
inline constexpr int kNV = 2;
static_assert(kColPad % (kNV * kW) == 0, "padded widths must hold whole register tiles");
#endif

template <int MR, int NV, bool Accum>
FLASHATTN_CPU_INLINE void micro_kernel(int k_len, const float* __restrict a, int64_t a_rs,
                                       int64_t a_ks, const float* __restrict b, int64_t ldb,
                                       float* __restrict c, int64_t ldc) {
  // Accumulate from zero and add C once at the end: a blocked sum, so rounding error grows
  // with the tile's k_len rather than with the number of tiles accumulated into C.
  vf acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = vf{};
  for (int k = 0; k < k_len; ++k) {
    vf bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = vload(b + k * ldb + v * kW);
    const float* ak = a + k * a_ks;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const vf av = vbcast(ak[r * a_rs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      vstore(c + r * ldc + v * kW, Accum ? vload(c + r * ldc + v * kW) + acc[r][v] : acc[r][v]);
}

// The last rows (rows < kMR) of a panel: micro_kernel<rows>.
template <int R, int NV, bool Accum>
FLASHATTN_CPU_INLINE void gemm_rows_tail(int rows, int k_len, const float* a, int64_t a_rs,
                                         int64_t a_ks, const float* b, int64_t ldb, float* c,
                                         int64_t ldc) {
  if (rows == R) return micro_kernel<R, NV, Accum>(k_len, a, a_rs, a_ks, b, ldb, c, ldc);
  if constexpr (R > 1) gemm_rows_tail<R - 1, NV, Accum>(rows, k_len, a, a_rs, a_ks, b, ldb, c, ldc);
}

template <int NV, bool Accum>
inline void gemm_panel(int m, int k_len, const float* a, int64_t a_rs, int64_t a_ks,
                       const float* b, int64_t ldb, float* c, int64_t ldc) {
  int r = 0;
  for (; r + kMR <= m; r += kMR)
    micro_kernel<kMR, NV, Accum>(k_len, a + r * a_rs, a_rs, a_ks, b, ldb, c + r * ldc, ldc);
  if (r < m)
    gemm_rows_tail<kMR - 1, NV, Accum>(m - r, k_len, a + r * a_rs, a_rs, a_ks, b, ldb,
                                       c + r * ldc, ldc);
}
// The last columns (vectors < kNV) of a gemm: one panel of that many vectors.
template <int NV, bool Accum>
FLASHATTN_CPU_INLINE void gemm_cols_tail(int vectors, int m, int k_len, const float* a,
                                         int64_t a_rs, int64_t a_ks, const float* b,
                                         int64_t ldb, float* c, int64_t ldc) {
  if (vectors == NV) return gemm_panel<NV, Accum>(m, k_len, a, a_rs, a_ks, b, ldb, c, ldc);
  if constexpr (NV > 1)
    gemm_cols_tail<NV - 1, Accum>(vectors, m, k_len, a, a_rs, a_ks, b, ldb, c, ldc);
}

// C[m x n] (=, or += when Accum) sum_k A(r, k) B[k][:], A(r, k) = a[r * a_rs + k * a_ks].
template <bool Accum>
inline void gemm(int m, int n, int k_len, const float* a, int64_t a_rs, int64_t a_ks,
                 const float* b, int64_t ldb, float* c, int64_t ldc) {
  int j = 0;
  for (; j + kNV * kW <= n; j += kNV * kW)
    gemm_panel<kNV, Accum>(m, k_len, a, a_rs, a_ks, b + j, ldb, c + j, ldc);
  if (j < n) gemm_cols_tail<kNV - 1, Accum>((n - j) / kW, m, k_len, a, a_rs, a_ks, b + j, ldb,
                                            c + j, ldc);
}
