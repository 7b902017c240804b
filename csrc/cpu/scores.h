// Score tile of the CPU kernels: raw q.k -> (score - bias) in log2 units, then the mask.
// Included inside namespace flashattn::cpu::FLASHATTN_CPU_ISA after gemm.h.

// s[i][j] holds q.k of query i0 + i and key j0 + j for i < m, j < nc (nc = n rounded up to
// kW; columns >= n are padding). On return it holds (score - bias[i]) * log2(e) (bias: none
// in the forward, the row's lse in the backward, so that P = exp2(s) directly), -inf where
// masked or padding. With dtanh, also writes the softcap derivative 1 - tanh^2 (backward).
inline void scores_log2(const FwdParams& p, const CpuMask& mi, float slope, int i0, int j0,
                        int m, int n, int nc, float* s, int lds, const float* bias,
                        float* dtanh) {
  const float softcap = p.softcap;
  const bool has_softcap = softcap > 0.f;
  if (!has_softcap && slope == 0.f) {
    if (!bias) {
      // Plain scores: the scale is folded into log2 space (scale * log2 e), one multiply.
      const vf sc = vbcast(p.softmax_scale_log2);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < nc; j += kW) vstore(s + i * lds + j, vload(s + i * lds + j) * sc);
    } else {
      // q.k * scale - lse in one rounding (fma) before the log2 e multiply: exp2 of
      // (q.k * scale_log2 - lse * log2 e) would add rounding errors of size |lse| * eps.
      const vf sc = vbcast(p.softmax_scale), log2e = vbcast(kLog2e);
      for (int i = 0; i < m; ++i) {
        const vf nb = vbcast(-bias[i]);
        for (int j = 0; j < nc; j += kW)
          vstore(s + i * lds + j, vfma(vload(s + i * lds + j), sc, nb) * log2e);
      }
    }
  } else {
    // the score of params.h step by step, kW columns at a time: scale, softcap, ALiBi.
    const vf scale = vbcast(p.softmax_scale), cap = vbcast(softcap), log2e = vbcast(kLog2e);
    const vf neg_slope = vbcast(-slope), one = vbcast(1.f);
    vi lane;
    for (int l = 0; l < kW; ++l) lane[l] = l;
    for (int i = 0; i < m; ++i) {
      float* row = s + i * lds;
      // |diag - j| is the ALiBi distance (positions: CpuMask's diagonal has the offsets);
      // 64-bit, then clamped so that a key index more cannot overflow int32.
      const int32_t diag = static_cast<int32_t>(
          clamp_i64(int64_t(i0) + i + mi.diag - j0, -(int64_t(1) << 31) + 256,
                    (int64_t(1) << 31) - 1));
      const vf b = vbcast(bias ? bias[i] : 0.f);
      for (int j = 0; j < nc; j += kW) {
        vf x = vload(row + j) * scale;
        if (has_softcap) {
          const vf t = vtanh(x / cap);
          if (dtanh) vstore(dtanh + i * lds + j, one - t * t);
          x = cap * t;
        }
        if (slope != 0.f) {
          const vi dist = (vi{} + diag) - (lane + j);
          x = vfma(neg_slope, __builtin_convertvector(dist < 0 ? -dist : dist, vf), x);
        }
        vstore(row + j, (x - b) * log2e);
      }
    }
  }
  // Visible keys of a row form one interval and its ends grow with the row, so the tile is
  // entirely visible iff its last row starts and its first row ends outside it.
  const bool full =
      n == nc && mi.key_begin(i0 + m - 1) <= j0 && mi.key_end(i0) >= j0 + n;
  if (full) return;
  const float neg_inf = -__builtin_inff();
  for (int i = 0; i < m; ++i) {
    float* row = s + i * lds;
    int kb = mi.key_begin(i0 + i) - j0, ke = mi.key_end(i0 + i) - j0;
    kb = kb < 0 ? 0 : (kb > nc ? nc : kb);
    ke = ke > n ? n : ke;
    ke = ke < kb ? kb : ke;
    for (int j = 0; j < kb; ++j) row[j] = neg_inf;
    for (int j = ke; j < nc; ++j) row[j] = neg_inf;
  }
}
