// Forward of the CPU backend: one task = (batch, head, bm query rows, see fwd_block_m); it
// streams the key tiles (kFwdBlockN columns) its rows can see with an online softmax, as the
// GPU kernels do. Keys come from the KV batch and row range of seq_info (KV cache) or
// through the block table (paged). Block-sparse (kv_num_blocks set): a task is one query
// block, and it streams only the kept key blocks' part of its visible keys (params.h).
// FP8 (kDt = kFloat8E4M3, params.h): the tile loads dequantize (e4m3 -> fp32, times the
// descale of the row's (b, KV head)); out is kOut (bf16 / fp16). Every other dtype has kOut = kDt.
// Included inside namespace flashattn::cpu::FLASHATTN_CPU_ISA after scores.h.

template <DType kDt, DType kOut = kDt>
struct FwdKernel {
  using T = typename Elem<kDt>::T;
  using TO = typename Elem<kOut>::T;
  static constexpr int kBN = kFwdBlockN;
  static_assert(kBN % kW == 0, "key tiles must hold whole vectors");

  static int64_t scratch_elems(const FwdParams& p, int bm) {
    const int d = p.headdim, dvp = round_up(p.headdim_v, kColPad);
    return int64_t(bm) * d + int64_t(d) * kBN + int64_t(kBN) * dvp + int64_t(bm) * kBN +
           int64_t(bm) * dvp + 2 * bm + d;
  }

  // Paged KV: the tile of logical key rows [r0, r0 + n) of sequence b, one run of rows per
  // page (params.h, page_of); k / v point at the head's column in page 0.
  static void load_paged(const FwdParams& p, int b, int64_t r0, int n, const T* k, const T* v,
                         float* kt, float* vs, float* tmp, float kd, float vd) {
    const int dvp = round_up(p.headdim_v, kColPad);
    for (int j = 0; j < n;) {
      const int64_t r = r0 + j, page = page_of(p, b, r);
      const int row = static_cast<int>(r % p.page_size);
      const int run = n - j < p.page_size - row ? n - j : p.page_size - row;
      load_transposed<kDt>(k + page * p.k_batch_stride + row * p.k_row_stride, p.k_row_stride,
                           run, p.headdim, kt + j, kBN, tmp, kd);
      const T* vp = v + page * p.v_batch_stride + row * p.v_row_stride;
      for (int i = 0; i < run; ++i)
        load_row_deq<kDt>(vp + i * p.v_row_stride, p.headdim_v, dvp, vd, vs + (j + i) * dvp);
      j += run;
    }
  }

  // Query rows [m_block * bm, + bm) of (b, h).
  static void tile(const FwdParams& p, int b, int h, int m_block, int bm, float* scratch) {
    const SeqInfo seq = seq_info(p, b);
    const int i0 = m_block * bm;
    if (i0 >= seq.seqlen_q) return;
    const CpuMask mi = cpu_mask(p, seq, b);
    const int m = seq.seqlen_q - i0 < bm ? seq.seqlen_q - i0 : bm;
    const int d = p.headdim, dv = p.headdim_v, dvp = round_up(dv, kColPad);
    const int hk = h / (p.nheads / p.nheads_k);
    const float slope = alibi_slope(p, b, h);
    const bool drop = p.dropout_threshold > 0;
    const float qd = descale_of(p.q_descale_ptr, p.q_descale_batch_stride, b, hk);
    const float kd = descale_of(p.k_descale_ptr, p.k_descale_batch_stride, b, hk);
    const float vd = descale_of(p.v_descale_ptr, p.v_descale_batch_stride, b, hk);

    float* qs = scratch;                     // bm x d
    float* kt = qs + int64_t(bm) * d;        // d x kBN   (K^T, the B operand of Q K^T)
    float* vs = kt + int64_t(d) * kBN;       // kBN x dvp
    float* s = vs + int64_t(kBN) * dvp;      // bm x kBN  (scores, then P)
    float* o = s + int64_t(bm) * kBN;        // bm x dvp  (unnormalised output)
    float* row_max = o + int64_t(bm) * dvp;  // log2 units
    float* row_sum = row_max + bm;
    float* tmp = row_sum + bm;               // d: one converted row of K

    const T* q = static_cast<const T*>(p.q_ptr) + b * p.q_batch_stride +
                 (seq.q_row0 + i0) * p.q_row_stride + h * p.q_head_stride;
    // Key row j of the sequence: k + j * k_row_stride; paged, through load_paged.
    const bool paged = p.block_table != nullptr;
    const T* k = static_cast<const T*>(p.k_ptr) + hk * p.k_head_stride;
    const T* v = static_cast<const T*>(p.v_ptr) + hk * p.v_head_stride;
    if (!paged) {
      k += seq.k_batch * p.k_batch_stride + seq.k_row0 * p.k_row_stride;
      v += seq.k_batch * p.v_batch_stride + seq.k_row0 * p.v_row_stride;
    }
    for (int i = 0; i < m; ++i) load_row_deq<kDt>(q + i * p.q_row_stride, d, d, qd, qs + i * d);
    for (int64_t x = 0; x < int64_t(m) * dvp; ++x) o[x] = 0.f;
    const float neg_inf = -__builtin_inff();
    for (int i = 0; i < m; ++i) row_max[i] = neg_inf, row_sum[i] = 0.f;

    // Only key tiles that some row of this tile can see: columns [n_begin, n_end), and with a
    // block mask only the kept key blocks' part of it (the rows are inside one query block).
    const int n_begin = mi.key_begin(i0), n_end_all = mi.key_end(i0 + m - 1);
    auto key_range = [&](const int n_lo, const int n_end) {
      for (int j0 = n_lo; j0 < n_end; j0 += kBN) {
        const int n = n_end - j0 < kBN ? n_end - j0 : kBN;
        const int nc = round_up(n, kW);
        if (paged) {
          load_paged(p, b, seq.k_row0 + j0, n, k, v, kt, vs, tmp, kd, vd);
        } else {
          load_transposed<kDt>(k + int64_t(j0) * p.k_row_stride, p.k_row_stride, n, d, kt, kBN,
                               tmp, kd);
          for (int j = 0; j < n; ++j)
            load_row_deq<kDt>(v + int64_t(j0 + j) * p.v_row_stride, dv, dvp, vd, vs + j * dvp);
        }
        for (int c = 0; c < d; ++c)
          for (int j = n; j < nc; ++j) kt[c * kBN + j] = 0.f;
        if (!paged && j0 + kBN < n_end) {
          const int n_next = n_end - j0 - kBN < kBN ? n_end - j0 - kBN : kBN;
          prefetch_rows(k + int64_t(j0 + kBN) * p.k_row_stride, p.k_row_stride * sizeof(T), n_next,
                        d * sizeof(T));
          prefetch_rows(v + int64_t(j0 + kBN) * p.v_row_stride, p.v_row_stride * sizeof(T), n_next,
                        dv * sizeof(T));
        }

        gemm<false>(m, nc, d, qs, d, 1, kt, kBN, s, kBN);
        scores_log2(p, mi, slope, i0, j0, m, n, nc, s, kBN, nullptr, nullptr);

        for (int i = 0; i < m; ++i) {
          float* sr = s + i * kBN;
          vf mx = vbcast(neg_inf);
          for (int j = 0; j < nc; j += kW) mx = vmax(mx, vload(sr + j));
          const float tile_max = hmax(mx);
          const float new_max = tile_max > row_max[i] ? tile_max : row_max[i];
          // -inf guard: a row with nothing visible yet subtracts 0, so exp2(-inf - 0) = 0
          // instead of exp2(-inf + inf) = NaN.
          const float ref = new_max == neg_inf ? 0.f : new_max;
          const float alpha = exp2f(row_max[i] - ref);
          const vf rv = vbcast(ref);
          vf sum = vf{};
          for (int j = 0; j < nc; j += kW) {
            const vf pj = vexp2(vload(sr + j) - rv);
            vstore(sr + j, pj);
            sum += pj;
          }
          row_sum[i] = row_sum[i] * alpha + hsum(sum);
          row_max[i] = new_max;
          if (alpha != 1.f) {
            const vf av = vbcast(alpha);
            float* orow = o + i * dvp;
            for (int c = 0; c < dvp; c += kW) vstore(orow + c, vload(orow + c) * av);
          }
        }
        // The sums above are the undropped softmax's (params.h); dropout zeroes what P V sees.
        if (drop) dropout_tile(p, b, h, i0, m, j0, n, 1.f, 0.f, s, kBN);
        gemm<true>(m, dvp, n, s, kBN, 1, vs, dvp, o, dvp);
      }
    };
    if (p.kv_num_blocks == nullptr) {
      key_range(n_begin, n_end_all);
    } else {
      // A query block past n_qblocks (varlen rows past max_seqlen_q: wrong metadata) keeps none.
      const int qb = i0 / p.block_m;
      const int64_t c = b * p.bs_batch_stride + h * p.bs_head_stride + qb;
      const int cnt = qb < p.n_qblocks ? static_cast<int>(clamp_i64(p.kv_num_blocks[c], 0,
                                                                    p.n_kblocks)) : 0;
      for (int t = 0; t < cnt; ++t) {
        const int64_t kb = clamp_i64(p.kv_indices[c * p.n_kblocks + t], 0, p.n_kblocks - 1);
        const int lo = static_cast<int>(kb * p.block_n), hi = lo + p.block_n;
        key_range(lo > n_begin ? lo : n_begin, hi < n_end_all ? hi : n_end_all);
      }
    }

    TO* out = static_cast<TO*>(p.o_ptr) + b * p.o_batch_stride +
             (seq.q_row0 + i0) * p.o_row_stride + h * p.o_head_stride;
    float* lse = p.lse_ptr + b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0 + i0;
    const float keep_scale = drop ? p.dropout_scale : 1.f;
    if (p.sink_ptr == nullptr) {
      for (int i = 0; i < m; ++i) {
        const float l = row_sum[i];
        const bool empty = !(l > 0.f);  // no visible key: out 0, lse -inf
        store_row<kOut>(o + i * dvp, dv, empty ? 0.f : keep_scale / l, out + i * p.o_row_stride);
        lse[i] = empty ? neg_inf : row_max[i] * kLn2 + logf(l);
      }
    } else {
      // exp(sink) joins the denominator, rescaled to the larger of the row's and the sink's
      // maximum; a row with no visible key (max -inf) gets weight 0 for o and lse = sink.
      const float s2 = sink_log2(p, h);
      for (int i = 0; i < m; ++i) {
        const float mx = row_max[i], ref = mx > s2 ? mx : s2;
        const float alpha = exp2f(mx - ref), l = row_sum[i] * alpha + exp2f(s2 - ref);
        store_row<kOut>(o + i * dvp, dv, alpha * keep_scale / l, out + i * p.o_row_stride);
        lse[i] = (mx > s2 ? mx * kLn2 : p.sink_ptr[h]) + logf(l);  // exactly sink if empty
      }
    }
  }

  static void run(const FwdParams& p, const ParallelFor& parallel_for) {
    int max_sq = p.seqlen_q;
    if (p.is_varlen) {  // the real lengths (cu_seqlens are host memory here), not max_seqlen
      max_sq = 0;
      for (int b = 0; b < p.batch; ++b) {
        const int sq = seq_info(p, b).seqlen_q;
        max_sq = sq > max_sq ? sq : max_sq;
      }
    }
    const int64_t bh = int64_t(p.batch) * p.nheads;
    // Block-sparse: one task per query block, so that its rows share one list of key blocks.
    const int bm = p.kv_num_blocks ? p.block_m : fwd_block_m(p, bh, max_sq);
    const int64_t n_mblocks = (max_sq + bm - 1) / bm;
    // The last query tiles first: under a causal mask they see the most keys.
    run_tasks(parallel_for, n_mblocks * bh, scratch_elems(p, bm), [&](int64_t t, float* scratch) {
      const int m_block = static_cast<int>(n_mblocks - 1 - t / bh);
      const int64_t r = t % bh;
      tile(p, static_cast<int>(r / p.nheads), static_cast<int>(r % p.nheads), m_block, bm,
           scratch);
    });
  }
};
