// The deterministic backward's ordering: which key blocks add into a query block's dQ rows,
// and in which fixed order (each key block's rank). Host and device code, torch-free, so the
// host check (tools/check_bwd_order.cpp, run by tests/test_bwd_order.py) tests these bodies.
#pragma once
#include "../common/mask.h"
#include "../common/seqlen.h"

namespace flashattn::sm80::bwd_order {

// min / max: the device intrinsics in device code (the kernels' instruction selection).
FLASHATTN_HOST_DEVICE int imin(int a, int b) {
#ifdef __CUDA_ARCH__
  return min(a, b);
#else
  return a < b ? a : b;
#endif
}
FLASHATTN_HOST_DEVICE int imax(int a, int b) {
#ifdef __CUDA_ARCH__
  return max(a, b);
#else
  return a > b ? a : b;
#endif
}

struct BlockRange {
  int first, second;
};

// Query-block range [first, second) of key block n: the union over its keys of the
// visible query rows (a band, so contiguous). Empty ranges are pinned to 0 (keys left of
// every query's window) or m_blocks (right of it) so that both ends stay non-decreasing in n.
template <int kBlockM, int kBlockN>
FLASHATTN_HOST_DEVICE BlockRange m_range(const MaskInfo& mi, int n, int m_blocks) {
  const int j0 = n * kBlockN;
  const int j1 = imin(j0 + kBlockN, mi.seqlen_k) - 1;
  if (j0 >= mi.seqlen_k) return {m_blocks, m_blocks};
  const int qb = mi.query_begin(j0), qe = mi.query_end(j1);
  if (qb >= qe) {
    const int v = qb == 0 ? 0 : m_blocks;
    return {v, v};
  }
  return {qb / kBlockM, (qe + kBlockM - 1) / kBlockM};
}

// Key blocks against query blocks without a left bound (right-bounded window, causal): key
// block x's first visible query block grows with x, so the key blocks that reach query block
// c are [0, first_above(c)).
template <int kBlockM, int kBlockN>
struct RightBounded {
  int nb, m_blocks, seqlen_q;
  int s;  // seqlen_k - seqlen_q + window_right: key j's first query row is j - s (clamped)

  FLASHATTN_HOST_DEVICE static RightBounded make(const MaskInfo& mi, int m_blocks) {
    return {(mi.seqlen_k + kBlockN - 1) / kBlockN, m_blocks, mi.seqlen_q,
            mi.shift() + mi.window_right};
  }
  // m_range(x).first for x < nb: the first visible query row's block, m_blocks when no
  // query row sees the block.
  FLASHATTN_HOST_DEVICE int mb(int x) const {
    const int qb = imin(imax(x * kBlockN - s, 0), seqlen_q);
    return qb >= seqlen_q ? m_blocks : qb / kBlockM;
  }
  // The first key block x in [0, nb) with mb(x) > c (nb if none), in closed form: for
  // 0 <= c < m_blocks, mb(x) > c iff x * kBlockN - s >= min(sq, (c+1) kBM).
  FLASHATTN_HOST_DEVICE int first_above(int c) const {
    if (c < 0) return 0;
    if (c >= m_blocks) return nb;
    const int need = imin(seqlen_q, (c + 1) * kBlockM) + s;  // x * kBlockN >= need
    const int x = need <= 0 ? 0 : (need + kBlockN - 1) / kBlockN;
    return imin(x, nb);
  }
};

// Rank of key block n among the key blocks that add into query block m, each CTA owning one
// key block. They are a contiguous range [lo, hi] (m_range's ends are monotone). Ascending
// order, except with a right-bounded window (causal), where key block n reaches query block
// m about (n_hi - n) * kBlockN / kBlockM steps after n_hi does: descending order there
// means nobody waits for a CTA that is behind it.
template <int kBlockM, int kBlockN>
FLASHATTN_HOST_DEVICE int contributor_rank(const MaskInfo& mi, int n, int m, int m_blocks,
                                           int n_blocks, bool descending) {
  if (descending && mi.window_left < 0)  // closed form: the last contributor is first_above - 1
    return RightBounded<kBlockM, kBlockN>::make(mi, m_blocks).first_above(m) - 1 - n;
  int lo = 0, hi = n_blocks;  // first index whose range end (or start) passes m
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    const BlockRange r = m_range<kBlockM, kBlockN>(mi, mid, m_blocks);
    if ((descending ? r.first : r.second) > m) hi = mid; else lo = mid + 1;
  }
  return descending ? (lo - 1) - n : n - lo;
}

// Rank of key block n at query block m when every key block visits all M query blocks
// rotated (n visits m at step (m - n) mod M): the CTAs that reached m at an earlier step,
// then those at the same step with a lower n (n' = n mod M when n_blocks > M).
FLASHATTN_HOST_DEVICE int rotated_rank(int n, int m, int M, int n_blocks) {
  const int t = ((m - n) % M + M) % M;
  const int q = n_blocks / M, r0 = n_blocks % M;
  int low = 0;  // residues (m - u) mod M, u in [0, t), that are < r0
  if (t > 0) {
    const int start = ((m - t + 1) % M + M) % M, end = start + t;
    low = imax(0, imin(end, r0) - start) + imax(0, imin(end, M + r0) - imax(start, M));
  }
  return t * q + low + n / M;
}

// Rotation chunks (no window): key blocks [0, nb) split into the fewest runs of consecutive
// blocks of at most max_chunk, as equal as possible. Each chunk rotates among itself, and in
// deterministic mode adds into a query block after every earlier chunk: a CTA waits only on
// earlier CTAs and on its own chunk, which fits on the GPU at once (max_chunk <= SMs).
struct Chunk {
  int start, size;
};
FLASHATTN_HOST_DEVICE Chunk rotation_chunk(int n, int nb, int max_chunk) {
  const int chunks = (nb + max_chunk - 1) / max_chunk;
  const int c = (nb + chunks - 1) / chunks;
  const int start = n / c * c;
  return {start, imin(c, nb - start)};
}
// Every key block adds into every query block without a window: the earlier chunks' blocks
// first, then the chunk's own rotated order.
FLASHATTN_HOST_DEVICE int chunked_rotated_rank(int n, int m, int M, const Chunk& ch) {
  return ch.start + rotated_rank(n - ch.start, m, M, ch.size);
}

}  // namespace flashattn::sm80::bwd_order
