// attn_probs (return_attn_probs=True) of the CPU backend: S of params.h, exp(s - m) with m
// the row's max visible score, negated where dropout drops it. Two passes over the keys per
// task: the row max, then S. One task = (batch, head, kBM query rows). A debugging output, as
// in flash-attn: O(seqlen^2) memory, portable build only. Included inside namespace
// flashattn::cpu::FLASHATTN_CPU_ISA after scores.h.

template <DType kDt>
struct ProbsKernel {
  using T = typename Elem<kDt>::T;
  static constexpr int kBM = 64, kBN = 64;

  static int64_t scratch_elems(const FwdParams& p) {
    return int64_t(kBM) * p.headdim + int64_t(p.headdim) * kBN + int64_t(kBM) * kBN + kBM +
           p.headdim;
  }

  static void tile(const FwdParams& p, int b, int h, int m_block, float* scratch) {
    const SeqInfo seq = seq_info(p, b);
    const int i0 = m_block * kBM;
    const int sq = seq.seqlen_q < p.s_rows ? seq.seqlen_q : p.s_rows;
    const int sk = seq.seqlen_k < p.s_cols ? seq.seqlen_k : p.s_cols;
    if (i0 >= sq) return;
    const CpuMask mi = cpu_mask(p, seq, b);
    const int m = sq - i0 < kBM ? sq - i0 : kBM, d = p.headdim;
    const int hk = h / (p.nheads / p.nheads_k);
    const float slope = alibi_slope(p, b, h);
    float* qs = scratch;                 // kBM x d
    float* kt = qs + int64_t(kBM) * d;   // d x kBN
    float* s = kt + int64_t(d) * kBN;    // kBM x kBN
    float* lse = s + int64_t(kBM) * kBN;  // the rows' max
    float* tmp = lse + kBM;
    const T* q = static_cast<const T*>(p.q_ptr) + b * p.q_batch_stride +
                 (seq.q_row0 + i0) * p.q_row_stride + h * p.q_head_stride;
    const T* k = static_cast<const T*>(p.k_ptr) + b * p.k_batch_stride +
                 seq.k_row0 * p.k_row_stride + hk * p.k_head_stride;
    for (int i = 0; i < m; ++i) load_row_vec<kDt>(q + i * p.q_row_stride, d, d, qs + i * d);
    auto scores = [&](int j0, int n, int nc, const float* bias) {
      load_transposed<kDt>(k + int64_t(j0) * p.k_row_stride, p.k_row_stride, n, d, kt, kBN, tmp);
      for (int c = 0; c < d; ++c)
        for (int j = n; j < nc; ++j) kt[c * kBN + j] = 0.f;
      gemm<false>(m, nc, d, qs, d, 1, kt, kBN, s, kBN);
      scores_log2(p, mi, slope, i0, j0, m, n, nc, s, kBN, bias, nullptr);
    };
    // Pass 1: the row max (log2 units; columns past n are masked by scores_log2).
    float* row_max = lse;  // kBM floats
    for (int i = 0; i < m; ++i) row_max[i] = -__builtin_inff();
    for (int j0 = 0; j0 < sk; j0 += kBN) {
      const int n = sk - j0 < kBN ? sk - j0 : kBN, nc = round_up(n, kW);
      scores(j0, n, nc, nullptr);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) row_max[i] = s[i * kBN + j] > row_max[i] ? s[i * kBN + j] : row_max[i];
    }
    // To natural units for scores_log2's bias; no visible key: +inf, so that exp2(-inf) = 0.
    for (int i = 0; i < m; ++i)
      row_max[i] = row_max[i] == -__builtin_inff() ? __builtin_inff() : row_max[i] * kLn2;
    T* out = static_cast<T*>(p.s_ptr) + b * p.s_batch_stride + h * p.s_head_stride +
             int64_t(i0) * p.s_row_stride;
    for (int j0 = 0; j0 < sk; j0 += kBN) {
      const int n = sk - j0 < kBN ? sk - j0 : kBN, nc = round_up(n, kW);
      scores(j0, n, nc, row_max);
      for (int i = 0; i < m; ++i) {
        float* sr = s + i * kBN;
        for (int j = 0; j < nc; j += kW) vstore(sr + j, vexp2(vload(sr + j)));
      }
      if (p.dropout_threshold > 0) dropout_tile(p, b, h, i0, m, j0, n, 1.f, -1.f, s, kBN);
      for (int i = 0; i < m; ++i) {
        float* sr = s + i * kBN;
        T* orow = out + int64_t(i) * p.s_row_stride + j0;
        for (int j = 0; j < n; ++j) orow[j] = Elem<kDt>::store(sr[j]);
      }
    }
  }

  static void run(const FwdParams& p, const ParallelFor& parallel_for) {
    const int64_t n_mblocks = (p.s_rows + kBM - 1) / kBM;
    const int64_t bh = int64_t(p.batch) * p.nheads;
    run_tasks(parallel_for, n_mblocks * bh, scratch_elems(p), [&](int64_t t, float* scratch) {
      const int64_t r = t % bh;
      tile(p, static_cast<int>(r / p.nheads), static_cast<int>(r % p.nheads),
           static_cast<int>(t / bh), scratch);
    });
  }
};

inline void run_probs(const FwdParams& p, const ParallelFor& parallel_for) {
  switch (p.dtype) {
    case DType::kFloat32: return ProbsKernel<DType::kFloat32>::run(p, parallel_for);
    case DType::kFloat16: return ProbsKernel<DType::kFloat16>::run(p, parallel_for);
    case DType::kBFloat16: return ProbsKernel<DType::kBFloat16>::run(p, parallel_for);
    case DType::kFloat8E4M3: return;  // the API refuses FP8 here (no dropout, no S)
  }
}
