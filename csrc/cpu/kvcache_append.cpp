// flash_attn_with_kvcache's append + rotary step on the CPU (params.h, KvAppendParams): k_new /
// v_new into the cache rows seqused_k[b] + i (through the block table when paged), rotated k,
// and q rotated into q_rot. Memory-bound and small next to the attention: scalar code.
#include <cstdint>

#include "../common/seqlen.h"
#include "convert.h"
#include "cpu_backend.h"

namespace flashattn::cpu {
namespace {

template <DType kDt>
struct Append {
  using T = typename Elem<kDt>::T;

  // dst[0, d) = src rotated at position pos (clamped into the table) over its first
  // rotary_dim dims, the rest copied; fp32 arithmetic, one rounding to the dtype. Pairs are
  // (2j, 2j + 1) interleaved, (j, j + rotary_dim / 2) otherwise: x0' = x0 cos - x1 sin,
  // x1' = x1 cos + x0 sin.
  static void rotate_row(const KvAppendParams& a, int64_t pos, const T* src, T* dst, int d) {
    const int rd = a.rotary_dim, half = rd / 2;
    const int64_t row = clamp_i64(pos, 0, a.seqlen_ro - 1) * a.rotary_stride;
    const T* cos = static_cast<const T*>(a.rotary_cos) + row;
    const T* sin = static_cast<const T*>(a.rotary_sin) + row;
    for (int j = 0; j < half; ++j) {
      const int i0 = a.rotary_interleaved ? 2 * j : j;
      const int i1 = a.rotary_interleaved ? 2 * j + 1 : j + half;
      const float c = Elem<kDt>::load(cos[j]), s = Elem<kDt>::load(sin[j]);
      const float x0 = Elem<kDt>::load(src[i0]), x1 = Elem<kDt>::load(src[i1]);
      dst[i0] = Elem<kDt>::store(x0 * c - x1 * s);
      dst[i1] = Elem<kDt>::store(x1 * c + x0 * s);
    }
    for (int c = rd; c < d; ++c) dst[c] = src[c];
  }

  // Cache row r of sequence b in k or v: paged through the block table, else in batch
  // seq.k_batch. The caller keeps r in [0, seqlen_k).
  static T* cache_row(const FwdParams& p, const SeqInfo& seq, int b, int64_t r, const void* base,
                      int64_t batch_stride, int64_t row_stride) {
    T* cache = static_cast<T*>(const_cast<void*>(base));  // the caches are this step's output
    if (p.block_table)
      return cache + page_of(p, b, r) * batch_stride + (r % p.page_size) * row_stride;
    return cache + seq.k_batch * batch_stride + r * row_stride;
  }

  // KV head hk of every sequence, in batch order: sequences that share cache rows (repeated
  // cache_batch_idx, shared pages) never write concurrently, and the last one wins.
  static void append_head(const FwdParams& p, const KvAppendParams& a, int hk) {
    for (int b = 0; b < p.batch; ++b) {
      const SeqInfo seq = seq_info(p, b);
      const int64_t start = p.seqused_k ? p.seqused_k[b] : 0;
      const T* kn = static_cast<const T*>(a.knew_ptr) + b * a.knew_batch_stride +
                    hk * a.knew_head_stride;
      const T* vn = static_cast<const T*>(a.vnew_ptr) + b * a.vnew_batch_stride +
                    hk * a.vnew_head_stride;
      for (int i = 0; i < p.seqlen_knew; ++i) {
        const int64_t r = start + i;
        if (r < 0 || r >= p.seqlen_k) continue;  // outside the cache: dropped (params.h)
        T* kc = cache_row(p, seq, b, r, p.k_ptr, p.k_batch_stride, p.k_row_stride) +
                hk * p.k_head_stride;
        T* vc = cache_row(p, seq, b, r, p.v_ptr, p.v_batch_stride, p.v_row_stride) +
                hk * p.v_head_stride;
        const T* ks = kn + i * a.knew_row_stride;
        const T* vs = vn + i * a.vnew_row_stride;
        if (a.rotary_dim > 0) {
          rotate_row(a, r, ks, kc, p.headdim);
        } else {
          for (int c = 0; c < p.headdim; ++c) kc[c] = ks[c];
        }
        for (int c = 0; c < p.headdim_v; ++c) vc[c] = vs[c];
      }
    }
  }

  // The query rows of (b, h), rotated into q_rot.
  static void rotate_q(const FwdParams& p, const KvAppendParams& a, int b, int h) {
    const int64_t start = p.seqused_k ? p.seqused_k[b] : 0;
    const T* q = static_cast<const T*>(p.q_ptr) + b * p.q_batch_stride + h * p.q_head_stride;
    T* qr = static_cast<T*>(a.q_rot_ptr) + b * a.q_rot_batch_stride + h * a.q_rot_head_stride;
    for (int i = 0; i < p.seqlen_q; ++i)
      rotate_row(a, start + (a.q_rot_per_row ? i : 0), q + i * p.q_row_stride,
                 qr + i * a.q_rot_row_stride, p.headdim);
  }

  static void run(const FwdParams& p, const KvAppendParams& a, const ParallelFor& parallel_for) {
    if (a.knew_ptr && a.vnew_ptr && p.seqlen_knew > 0)
      parallel_for(p.nheads_k, [&](int64_t begin, int64_t end) {
        for (int64_t hk = begin; hk < end; ++hk) append_head(p, a, static_cast<int>(hk));
      });
    if (a.rotary_dim > 0 && a.q_rot_ptr)
      parallel_for(int64_t(p.batch) * p.nheads, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t)
          rotate_q(p, a, static_cast<int>(t / p.nheads), static_cast<int>(t % p.nheads));
      });
  }
};

}  // namespace

void run_kvcache_append(const FwdParams& params, const KvAppendParams& append,
                        const ParallelFor& parallel_for) {
  switch (params.dtype) {
    case DType::kFloat32: return Append<DType::kFloat32>::run(params, append, parallel_for);
    case DType::kFloat16: return Append<DType::kFloat16>::run(params, append, parallel_for);
    case DType::kBFloat16: return Append<DType::kBFloat16>::run(params, append, parallel_for);
    case DType::kFloat8E4M3: return;  // the API refuses FP8 KV caches (issue 14)
  }
}

}  // namespace flashattn::cpu
