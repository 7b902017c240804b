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

// Smallest x in [lo, hi) with pred(x) (pred false then true over the range); hi if none.
template <typename Pred>
FLASHATTN_HOST_DEVICE int first_true(int lo, int hi, Pred pred) {
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (pred(mid)) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// Rank of key block n among the key blocks that add into query block m, each CTA owning one
// key block. They are a contiguous range [lo, hi] (m_range's ends are monotone). Ascending
// order, except with a right-bounded window (causal), where key block n reaches query block
// m about (n_hi - n) * kBlockN / kBlockM steps after n_hi does: descending order there
// means nobody waits for a CTA that is behind it.
template <int kBlockM, int kBlockN>
FLASHATTN_HOST_DEVICE int contributor_rank(const MaskInfo& mi, int n, int m, int m_blocks,
                                           int n_blocks, bool descending) {
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

// Paired order (deterministic, right-bounded window only, kBlockN = 2 kBlockM): CTA p of a
// sequence with nb key blocks owns block a = nb - 1 - p (phase A, query blocks ascending)
// and then block p (phase B, descending) unless p = a, so every CTA does about the same work
// and the longest CTAs need not come last. A block's step at m happens at time t (steps
// since its CTA started); contributors add in (t, n) order, which no CTA ever runs against.
struct PairedOrder {
  int nb, m_blocks;
  FLASHATTN_HOST_DEVICE int pairs() const { return (nb + 1) / 2; }
  FLASHATTN_HOST_DEVICE int first_b() const { return nb - pairs(); }  // phase-B blocks: [0, first_b)
};

// Time of key block n's step at query block m; mb(x) = m_range(x).first.
template <typename Mb>
FLASHATTN_HOST_DEVICE int paired_time(const PairedOrder& o, int n, int m, Mb mb) {
  if (n >= o.first_b()) return m - mb(n);
  return 2 * o.m_blocks - 1 - m - mb(o.nb - 1 - n);  // after block nb-1-n: m_blocks - mb steps
}

template <typename Mb>
FLASHATTN_HOST_DEVICE int paired_rank(const PairedOrder& o, int n, int m, Mb mb) {
  const int t = paired_time(o, n, m, mb);
  const int hi1 = first_true(0, o.nb, [&](int x) { return mb(x) > m; });  // contributors [0, hi1)
  // Phase A, n' in [first_b, hi1): time m - mb(n') falls as n' grows.
  const int a0 = imin(o.first_b(), hi1);
  const int s1 = first_true(a0, hi1, [&](int x) { return mb(x) > m - t; });   // time < t
  const int s2 = first_true(a0, hi1, [&](int x) { return mb(x) >= m - t; });  // time <= t
  // Phase B, n' in [0, b1): time 2 M - 1 - m - mb(nb - 1 - n') grows with n'.
  const int b1 = a0;
  const int c = 2 * o.m_blocks - 1 - m - t;
  const int e1 = first_true(0, b1, [&](int x) { return mb(o.nb - 1 - x) <= c; });  // time < t
  const int e2 = first_true(0, b1, [&](int x) { return mb(o.nb - 1 - x) < c; });   // time <= t
  return (hi1 - s1) + imax(0, imin(s1, n) - s2) + e1 + imax(0, imin(e2, n) - e1);
}

}  // namespace flashattn::sm80::bwd_order
