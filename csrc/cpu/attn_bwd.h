// Backward of the CPU backend, in three passes:
//   1. D = rowsum(dO * O) into params.dsoftmax_sum, one task per (batch, head, row tile);
//   2. one task per (batch, kv head, split): for its key tiles (every G-th), over the query
//      heads of the GQA group and the query tiles that see them: recompute P, then
//      dV += P^T dO, dP = dO V^T, dS = P (dP - D), dK += dS^T Q, and dQ += dS K into split
//      g's fp32 copy of dQ in the workspace (each copy has one writer: no races);
//   3. dq = sum over the G copies in a fixed order, rounded once.
// Block-sparse (q_num_blocks set): the key tiles are the key blocks, each walks only the query
// blocks that keep it (params.h), and one that none keeps is not read (dK = dV = 0).
// Deterministic for any thread count. Included inside namespace
// flashattn::cpu::FLASHATTN_CPU_ISA after scores.h.

template <DType kDt>
struct BwdKernel {
  using T = typename Elem<kDt>::T;
  static constexpr int kBM = kBwdBlockM;
  static_assert(kBwdBlockNMax % kW == 0 && 64 % kW == 0, "key tiles must hold whole vectors");

  static int64_t scratch_elems(const BwdParams& p, int bn) {
    const int d = p.headdim, dv = p.headdim_v;
    const int dp = round_up(d, kColPad), dvp = round_up(dv, kColPad);
    return int64_t(bn) * dp * 2 + int64_t(d) * bn + int64_t(dv) * bn + int64_t(bn) * dvp +
           int64_t(kBM) * (dp + dvp) + 3 * int64_t(kBM) * bn + 2 * kBM + dv;
  }

  static void dsum_tile(const BwdParams& p, int b, int h, int m_block) {
    const SeqInfo seq = seq_info(p, b);
    const int i0 = m_block * kBM;
    if (i0 >= seq.seqlen_q) return;
    const int m = seq.seqlen_q - i0 < kBM ? seq.seqlen_q - i0 : kBM;
    const T* dout = static_cast<const T*>(p.do_ptr) + b * p.do_batch_stride +
                    (seq.q_row0 + i0) * p.do_row_stride + h * p.do_head_stride;
    const T* out = static_cast<const T*>(p.o_ptr) + b * p.o_batch_stride +
                   (seq.q_row0 + i0) * p.o_row_stride + h * p.o_head_stride;
    float* dsum = p.dsoftmax_sum + b * p.lse_batch_stride + h * p.lse_head_stride +
                  seq.q_row0 + i0;
    for (int i = 0; i < m; ++i) {
      const T* dor = dout + i * p.do_row_stride;
      const T* orow = out + i * p.o_row_stride;
      // The fma chain of the dP = dO V^T micro-kernel, in its order: where out equals a
      // row of V (a row that sees one key) dP - D is then exactly 0, as it is in exact math.
      float acc = 0.f;
      for (int c = 0; c < p.headdim_v; ++c)
        acc = sfma(Elem<kDt>::load(dor[c]), Elem<kDt>::load(orow[c]), acc);
      dsum[i] = acc;
    }
  }

  // Block-sparse: whether some query head h0 .. h0 + group - 1 of batch b keeps key block kb.
  static bool key_block_kept(const BwdParams& p, int b, int h0, int group, int kb) {
    if (kb >= p.n_kblocks) return false;
    for (int h = h0; h < h0 + group; ++h)
      if (p.q_num_blocks[b * p.bs_t_batch_stride + h * p.bs_t_head_stride + kb] > 0) return true;
    return false;
  }

  // Key tiles split, split + n_splits, ... (bn keys each) of (b, hk).
  static void kv_task(const BwdParams& p, int b, int hk, int split, int n_splits, int bn,
                      float* scratch) {
    const SeqInfo seq = seq_info(p, b);
    const CpuMask mi = cpu_mask(p, seq, b);
    const int d = p.headdim, dv = p.headdim_v;
    const int dp = round_up(d, kColPad), dvp = round_up(dv, kColPad);
    const int group = p.nheads / p.nheads_k;
    const float scale = p.softmax_scale;
    const bool has_softcap = p.softcap > 0.f;
    const bool drop = p.dropout_threshold > 0;
    const int64_t ws_row0 = p.is_varlen ? seq.q_row0 : int64_t(b) * p.seqlen_q;
    const int64_t ws_ld = int64_t(p.nheads) * dp;

    float* kn = scratch;                     // bn x dp   (K, the B operand of dS K)
    float* dk_acc = kn + int64_t(bn) * dp;   // bn x dp
    float* kt = dk_acc + int64_t(bn) * dp;   // d x bn    (K^T for Q K^T)
    float* vt = kt + int64_t(d) * bn;        // dv x bn   (V^T for dO V^T)
    float* dv_acc = vt + int64_t(dv) * bn;   // bn x dvp
    float* qs = dv_acc + int64_t(bn) * dvp;  // kBM x dp
    float* dos = qs + int64_t(kBM) * dp;     // kBM x dvp
    float* ps = dos + int64_t(kBM) * dvp;    // kBM x bn: scores, then P
    float* ds = ps + int64_t(kBM) * bn;      // kBM x bn: dP, then dS
    float* dtanh = ds + int64_t(kBM) * bn;   // kBM x bn: softcap derivative
    float* lse = dtanh + int64_t(kBM) * bn;
    float* dsum = lse + kBM;
    float* tmp = dsum + kBM;                 // dv: one converted row of V

    const T* k = static_cast<const T*>(p.k_ptr) + b * p.k_batch_stride +
                 seq.k_row0 * p.k_row_stride + hk * p.k_head_stride;
    const T* v = static_cast<const T*>(p.v_ptr) + b * p.v_batch_stride +
                 seq.k_row0 * p.v_row_stride + hk * p.v_head_stride;
    T* dk = static_cast<T*>(p.dk_ptr) + b * p.dk_batch_stride + seq.k_row0 * p.dk_row_stride +
            hk * p.dk_head_stride;
    T* dvg = static_cast<T*>(p.dv_ptr) + b * p.dv_batch_stride +
             seq.k_row0 * p.dv_row_stride + hk * p.dv_head_stride;

    for (int j0 = split * bn; j0 < seq.seqlen_k; j0 += n_splits * bn) {
      const int n = seq.seqlen_k - j0 < bn ? seq.seqlen_k - j0 : bn;
      const int nc = round_up(n, kW);
      if (p.q_num_blocks && !key_block_kept(p, b, hk * group, group, j0 / bn)) {
        // Block-sparse: no query head of the group keeps this key block: dK = dV = 0, unread.
        const float zeros[kMaxHeadDim] = {};
        for (int j = 0; j < n; ++j) {
          store_row<kDt>(zeros, d, 1.f, dk + int64_t(j0 + j) * p.dk_row_stride);
          store_row<kDt>(zeros, dv, 1.f, dvg + int64_t(j0 + j) * p.dv_row_stride);
        }
        continue;
      }
      for (int j = 0; j < n; ++j) {
        load_row_vec<kDt>(k + int64_t(j0 + j) * p.k_row_stride, d, dp, kn + j * dp);
        for (int c = 0; c < d; ++c) kt[c * bn + j] = kn[j * dp + c];
      }
      load_transposed<kDt>(v + int64_t(j0) * p.v_row_stride, p.v_row_stride, n, dv, vt, bn, tmp);
      for (int j = n; j < nc; ++j) {
        for (int c = 0; c < d; ++c) kt[c * bn + j] = 0.f;
        for (int c = 0; c < dv; ++c) vt[c * bn + j] = 0.f;
      }
      for (int64_t x = 0; x < int64_t(n) * dp; ++x) dk_acc[x] = 0.f;
      for (int64_t x = 0; x < int64_t(n) * dvp; ++x) dv_acc[x] = 0.f;

      // Query rows that see some key of this tile.
      const int q_begin = mi.query_begin(j0), q_end_all = mi.query_end(j0 + n - 1);
      for (int hh = 0; hh < group; ++hh) {
        const int h = hk * group + hh;
        const float slope = alibi_slope(p, b, h);
        const T* q = static_cast<const T*>(p.q_ptr) + b * p.q_batch_stride +
                     seq.q_row0 * p.q_row_stride + h * p.q_head_stride;
        const T* dout = static_cast<const T*>(p.do_ptr) + b * p.do_batch_stride +
                        seq.q_row0 * p.do_row_stride + h * p.do_head_stride;
        const int64_t lse_off = b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0;
        auto query_range = [&](const int q_lo, const int q_end) {
          for (int i0 = q_lo; i0 < q_end; i0 += kBM) {
            const int m = q_end - i0 < kBM ? q_end - i0 : kBM;
            if (i0 + kBM < q_end) {
              const int m_next = q_end - i0 - kBM < kBM ? q_end - i0 - kBM : kBM;
              prefetch_rows(q + int64_t(i0 + kBM) * p.q_row_stride, p.q_row_stride * sizeof(T),
                            m_next, d * sizeof(T));
              prefetch_rows(dout + int64_t(i0 + kBM) * p.do_row_stride,
                            p.do_row_stride * sizeof(T), m_next, dv * sizeof(T));
            }
            for (int i = 0; i < m; ++i) {
              load_row_vec<kDt>(q + int64_t(i0 + i) * p.q_row_stride, d, dp, qs + i * dp);
              load_row_vec<kDt>(dout + int64_t(i0 + i) * p.do_row_stride, dv, dvp, dos + i * dvp);
              // lse = -inf (no visible key) -> +inf, so that P = exp2(s - inf) = 0.
              const float l = p.lse_ptr[lse_off + i0 + i];
              lse[i] = l == -__builtin_inff() ? __builtin_inff() : l;
              dsum[i] = p.dsoftmax_sum[lse_off + i0 + i];
            }
            gemm<false>(m, nc, d, qs, dp, 1, kt, bn, ps, bn);
            scores_log2(p, mi, slope, i0, j0, m, n, nc, ps, bn, lse, dtanh);
            for (int i = 0; i < m; ++i) {
              float* pr = ps + i * bn;
              for (int j = 0; j < nc; j += kW) vstore(pr + j, vexp2(vload(pr + j)));
            }
            if (drop) {
              // dV takes the dropped, rescaled P (built in ds, free until dP), dP = Z dP scale.
              for (int i = 0; i < m; ++i)
                for (int j = 0; j < nc; ++j) ds[i * bn + j] = ps[i * bn + j];
              dropout_tile(p, b, h, i0, m, j0, n, p.dropout_scale, 0.f, ds, bn);
              gemm<true>(n, dvp, m, ds, 1, bn, dos, dvp, dv_acc, dvp);
            } else {
              gemm<true>(n, dvp, m, ps, 1, bn, dos, dvp, dv_acc, dvp);
            }
            gemm<false>(m, nc, dv, dos, dvp, 1, vt, bn, ds, bn);
            if (drop) dropout_tile(p, b, h, i0, m, j0, n, p.dropout_scale, 0.f, ds, bn);
            for (int i = 0; i < m; ++i) {
              const vf di = vbcast(dsum[i]), sc = vbcast(scale);
              const float* pr = ps + i * bn;
              float* dr = ds + i * bn;
              if (has_softcap) {
                const float* tr = dtanh + i * bn;
                for (int j = 0; j < nc; j += kW)
                  vstore(dr + j, vload(pr + j) * (vload(dr + j) - di) * vload(tr + j) * sc);
              } else {
                for (int j = 0; j < nc; j += kW)
                  vstore(dr + j, vload(pr + j) * (vload(dr + j) - di) * sc);
              }
            }
            gemm<true>(n, dp, m, ds, 1, bn, qs, dp, dk_acc, dp);
            float* dq_ws = p.workspace_f32 +
                           ((int64_t(split) * p.total_q + ws_row0 + i0) * p.nheads + h) * dp;
            gemm<true>(m, dp, n, ds, bn, 1, kn, dp, dq_ws, ws_ld);
          }
        };
        if (p.q_num_blocks == nullptr) {
          query_range(q_begin, q_end_all);
        } else {
          // Block-sparse: this tile is key block j0 / bn (bn = block_n); its kept query blocks.
          // Past n_kblocks (varlen keys past max_seqlen_k: wrong metadata): no query block.
          const int64_t c = b * p.bs_t_batch_stride + h * p.bs_t_head_stride + j0 / bn;
          const int cnt = j0 / bn < p.n_kblocks
                              ? static_cast<int>(clamp_i64(p.q_num_blocks[c], 0, p.n_qblocks))
                              : 0;
          for (int t = 0; t < cnt; ++t) {
            const int64_t qb = clamp_i64(p.q_indices[c * p.n_qblocks + t], 0, p.n_qblocks - 1);
            const int lo = static_cast<int>(qb * p.block_m), hi = lo + p.block_m;
            query_range(lo > q_begin ? lo : q_begin, hi < q_end_all ? hi : q_end_all);
          }
        }
      }
      for (int j = 0; j < n; ++j) {
        store_row<kDt>(dk_acc + j * dp, d, 1.f, dk + int64_t(j0 + j) * p.dk_row_stride);
        store_row<kDt>(dv_acc + j * dvp, dv, 1.f, dvg + int64_t(j0 + j) * p.dv_row_stride);
      }
    }
  }

  // dsink_h = -sum_i exp(sink_h - lse_i) D_i (params.h) over every sequence's rows, in double
  // and a fixed order (O(rows), after the D pass).
  static void dsink(const BwdParams& p, const ParallelFor& parallel_for) {
    run_tasks(parallel_for, p.nheads, 0, [&](int64_t t, float*) {
      const int h = static_cast<int>(t);
      const double sink = p.sink_ptr[h];
      double acc = 0.0;
      for (int b = 0; b < p.batch; ++b) {
        const SeqInfo seq = seq_info(p, b);
        const int64_t off = b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0;
        for (int i = 0; i < seq.seqlen_q; ++i)
          acc += std::exp(sink - p.lse_ptr[off + i]) * p.dsoftmax_sum[off + i];
      }
      p.dsink_ptr[h] += static_cast<float>(-acc);
    });
  }

  // dq rows [r0, r1) of the flat (total_q, nheads) view: the sum of the split copies.
  static void dq_rows(const BwdParams& p, int n_splits, int64_t r0, int64_t r1) {
    const int d = p.headdim, dp = round_up(d, kColPad);
    const int64_t split_stride = p.total_q * p.nheads * dp;
    float acc[kMaxHeadDim];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = p.is_varlen ? 0 : r / p.seqlen_q, i = p.is_varlen ? r : r % p.seqlen_q;
      for (int h = 0; h < p.nheads; ++h) {
        const float* src = p.workspace_f32 + (r * p.nheads + h) * dp;
        for (int c = 0; c < d; ++c) acc[c] = src[c];
        for (int g = 1; g < n_splits; ++g)
          for (int c = 0; c < d; ++c) acc[c] += src[g * split_stride + c];
        T* dst = static_cast<T*>(p.dq_ptr) + b * p.dq_batch_stride + i * p.dq_row_stride +
                 h * p.dq_head_stride;
        store_row<kDt>(acc, d, 1.f, dst);
      }
    }
  }

  // Varlen key rows before the first or after the last sequence: no task writes them, so
  // their dK / dV are zeroed here (the CUDA backend's convert kernel does the same).
  static void zero_uncovered_kv_rows(const BwdParams& p) {
    const int64_t first = clamp_i64(p.cu_seqlens_k[0], 0, p.total_k);
    const int64_t last = clamp_i64(p.cu_seqlens_k[p.batch], first, p.total_k);
    const float zeros[kMaxHeadDim] = {};
    for (int64_t r = 0; r < p.total_k; ++r) {
      if (r == first) r = last;
      if (r >= p.total_k) break;
      for (int hk = 0; hk < p.nheads_k; ++hk) {
        store_row<kDt>(zeros, p.headdim, 1.f,
                       static_cast<T*>(p.dk_ptr) + r * p.dk_row_stride + hk * p.dk_head_stride);
        store_row<kDt>(zeros, p.headdim_v, 1.f,
                       static_cast<T*>(p.dv_ptr) + r * p.dv_row_stride + hk * p.dv_head_stride);
      }
    }
  }

  static void run(const BwdParams& p, const ParallelFor& parallel_for) {
    if (p.is_varlen) zero_uncovered_kv_rows(p);
    const int n_splits = bwd_num_splits(p);
    int max_sq = p.seqlen_q;
    if (p.is_varlen) {
      max_sq = 0;
      for (int b = 0; b < p.batch; ++b) {
        const int sq = seq_info(p, b).seqlen_q;
        max_sq = sq > max_sq ? sq : max_sq;
      }
    }
    const int64_t n_mblocks = (max_sq + kBM - 1) / kBM;
    const int64_t bh = int64_t(p.batch) * p.nheads;
    run_tasks(parallel_for, n_mblocks * bh, 0, [&](int64_t t, float*) {
      const int64_t r = t % bh;
      dsum_tile(p, static_cast<int>(r / p.nheads), static_cast<int>(r % p.nheads),
                static_cast<int>(t / bh));
    });
    if (p.sink_ptr) dsink(p, parallel_for);
    const int64_t bhk = int64_t(p.batch) * p.nheads_k;
    const int bn = bwd_block_n(p);
    run_tasks(parallel_for, bhk * n_splits, scratch_elems(p, bn), [&](int64_t t, float* scratch) {
      const int64_t r = t % bhk;
      kv_task(p, static_cast<int>(r / p.nheads_k), static_cast<int>(r % p.nheads_k),
              static_cast<int>(t / bhk), n_splits, bn, scratch);
    });
    constexpr int64_t kRowsPerTask = 64;
    run_tasks(parallel_for, (p.total_q + kRowsPerTask - 1) / kRowsPerTask, 0,
              [&](int64_t t, float*) {
                const int64_t r0 = t * kRowsPerTask;
                dq_rows(p, n_splits, r0, r0 + kRowsPerTask < p.total_q ? r0 + kRowsPerTask
                                                                       : p.total_q);
              });
  }
};
