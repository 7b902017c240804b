// Host check of the deterministic backward's orders (csrc/sm80/bwd_order_sm80.h): for random
// shapes, windows, position shifts (issue 17) and tiles, each rank formula against the order
// it stands for (brute force over the CTAs' actual visiting sequences), and a run of the
// waits: every CTA makes its adds in its visiting order, each when its rank comes up, with
// only the first `resident` CTAs of the launch order on the GPU; it must finish. Built and
// run by tests/test_bwd_order.py.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "sm80/bwd_order_sm80.h"

using namespace flashattn;
using namespace flashattn::sm80::bwd_order;

namespace {

struct Visit {
  int n, m, t;  // key block, query block, step of its CTA
};
using Cta = std::vector<Visit>;  // one CTA's adds, in order

int failures = 0;
#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      if (++failures <= 20) std::printf("FAIL: " __VA_ARGS__); \
    }                                                         \
  } while (0)

// Runs the waits: CTAs in launch order, at most `resident` unfinished ones active (in-order
// dispatch). rank[i][k] is CTA i's rank at its k-th add. Returns false on a deadlock.
bool runs_to_end(const std::vector<Cta>& ctas, const std::vector<std::vector<int>>& rank,
                 int m_blocks, int resident) {
  std::vector<int> counter(m_blocks, 0), next(ctas.size(), 0);
  size_t first_unfinished = 0, done = 0;
  for (const Cta& c : ctas) done += c.empty();
  while (done < ctas.size()) {
    bool progress = false;
    int active = 0;
    for (size_t i = first_unfinished; i < ctas.size() && active < resident; ++i) {
      if (next[i] == int(ctas[i].size())) continue;
      ++active;
      while (next[i] < int(ctas[i].size())) {
        const Visit& v = ctas[i][next[i]];
        if (counter[v.m] != rank[i][next[i]]) break;
        ++counter[v.m];
        ++next[i];
        progress = true;
      }
      if (next[i] == int(ctas[i].size())) ++done;
    }
    while (first_unfinished < ctas.size() && next[first_unfinished] == int(ctas[first_unfinished].size()))
      ++first_unfinished;
    if (!progress && done < ctas.size()) return false;
  }
  return true;
}

// Expected ranks: per query block, the visits sorted by key (ties are a bug in the order).
template <typename Key>
std::vector<std::vector<int>> ranks_by(const std::vector<Cta>& ctas, int m_blocks, Key key) {
  std::vector<std::vector<std::pair<decltype(key(Visit{})), std::pair<int, int>>>> at(m_blocks);
  std::vector<std::vector<int>> rank(ctas.size());
  for (size_t i = 0; i < ctas.size(); ++i) {
    rank[i].resize(ctas[i].size());
    for (size_t k = 0; k < ctas[i].size(); ++k)
      at[ctas[i][k].m].push_back({key(ctas[i][k]), {int(i), int(k)}});
  }
  for (auto& list : at) {
    std::sort(list.begin(), list.end());
    for (size_t r = 0; r < list.size(); ++r) rank[list[r].second.first][list[r].second.second] = r;
  }
  return rank;
}

template <int kBM, int kBN>
void check_shape(int sq, int sk, int wl, int wr, int pos_shift) {
  const MaskInfo mi{sq, sk, wl, wr, pos_shift};
  const int m_blocks = (sq + kBM - 1) / kBM, nb = (sk + kBN - 1) / kBN;
  auto range = [&](int n) { return m_range<kBM, kBN>(mi, n, m_blocks); };
  auto mb = [&](int n) { return range(n).first; };
  char what[160];
  std::snprintf(what, sizeof what, "sq %d sk %d window (%d, %d) shift %d tile %dx%d", sq, sk,
                wl, wr, pos_shift, kBM, kBN);
  // m_range against the mask, and its monotone ends.
  for (int n = 0; n < nb; ++n) {
    const BlockRange r = range(n);
    for (int m = 0; m < m_blocks; ++m) {
      bool any = false;  // some row's visible keys [key_begin, key_end) meet the key block
      for (int i = m * kBM; i < std::min(sq, (m + 1) * kBM) && !any; ++i)
        any = std::max(mi.key_begin(i), n * kBN) < std::min(mi.key_end(i), (n + 1) * kBN);
      CHECK(any == (r.first <= m && m < r.second), "%s: m_range(%d) misses m %d\n", what, n, m);
    }
    if (n > 0) CHECK(range(n - 1).first <= r.first && range(n - 1).second <= r.second,
                     "%s: m_range not monotone at %d\n", what, n);
  }
  const bool right_bounded = wr >= 0;
  // One CTA per key block, ascending visits; descending order with a right bound (the grid
  // walked backwards), ascending otherwise.
  {
    std::vector<Cta> ctas;
    for (int i = 0; i < nb; ++i) {
      const int n = right_bounded ? nb - 1 - i : i;
      Cta c;
      const BlockRange r = range(n);
      for (int m = r.first; m < r.second; ++m) c.push_back({n, m, m - r.first});
      ctas.push_back(c);
    }
    auto want = ranks_by(ctas, m_blocks, [&](const Visit& v) { return right_bounded ? -v.n : v.n; });
    for (size_t i = 0; i < ctas.size(); ++i)
      for (size_t k = 0; k < ctas[i].size(); ++k) {
        const int got = contributor_rank<kBM, kBN>(mi, ctas[i][k].n, ctas[i][k].m, m_blocks, nb,
                                                   right_bounded);
        CHECK(got == want[i][k], "%s: contributor_rank\n", what);
      }
    if (right_bounded) CHECK(runs_to_end(ctas, want, m_blocks, 1), "%s: descending deadlocks\n", what);
  }
  // No window: visits rotated within chunks of at most `cap` key blocks, added chunk by chunk;
  // only `cap` CTAs on the GPU at once.
  if (wl < 0 && wr < 0 && m_blocks > 0) {
    for (int cap : {nb, 1, 2, 3, std::max(1, nb / 2), std::max(1, nb - 1)}) {
      std::vector<Cta> ctas;
      std::vector<int> chunk_of(nb);
      for (int n = 0; n < nb; ++n) {
        const Chunk ch = rotation_chunk(n, nb, cap);
        CHECK(ch.size <= cap && ch.start <= n && n < ch.start + ch.size, "%s: chunk\n", what);
        chunk_of[n] = ch.start;
        Cta c;
        const int r = (n - ch.start) % m_blocks;
        for (int k = 0; k < m_blocks; ++k) c.push_back({n, (k + r) % m_blocks, k});
        ctas.push_back(c);
      }
      auto want = ranks_by(ctas, m_blocks, [&](const Visit& v) {
        return std::make_pair(chunk_of[v.n], std::make_pair(v.t, v.n));
      });
      for (size_t i = 0; i < ctas.size(); ++i)
        for (size_t k = 0; k < ctas[i].size(); ++k) {
          const Visit& v = ctas[i][k];
          CHECK(chunked_rotated_rank(v.n, v.m, m_blocks, rotation_chunk(v.n, nb, cap)) ==
                    want[i][k], "%s: chunked_rotated_rank (chunk cap %d)\n", what, cap);
        }
      CHECK(runs_to_end(ctas, want, m_blocks, cap), "%s: rotated deadlocks (cap %d)\n", what,
            cap);
    }
  }
  // Right bound only: the closed forms contributor_rank uses.
  if (wl < 0 && right_bounded) {
    const auto o = RightBounded<kBM, kBN>::make(mi, m_blocks);
    CHECK(o.nb == nb, "%s: RightBounded nb\n", what);
    for (int x = 0; x < nb; ++x) CHECK(o.mb(x) == mb(x), "%s: RightBounded::mb(%d)\n", what, x);
    for (int c = -2; c <= m_blocks + 1; ++c) {
      int first = 0;
      while (first < nb && mb(first) <= c) ++first;
      CHECK(o.first_above(c) == first, "%s: first_above(%d)\n", what, c);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 300;
  const unsigned seed = argc > 2 ? unsigned(std::atoi(argv[2])) : std::random_device{}();
  std::mt19937 rng(seed);
  auto len = [&]() { return int(std::uniform_int_distribution<int>(1, 1500)(rng)); };
  auto win = [&](int lim) { return int(std::uniform_int_distribution<int>(-1, lim)(rng)); };
  for (int c = 0; c < cases; ++c) {
    const int sq = len(), sk = c % 3 == 0 ? sq : len();
    const int kind = c % 4;  // causal, right-bounded, two-sided, none / left-only
    const int wr = kind == 0 ? 0 : kind == 1 ? win(300) : kind == 2 ? win(300) : -1;
    const int wl = kind <= 1 || (kind == 3 && c % 8 == 3) ? -1 : win(300);  // half: no window
    // Position offsets (issue 17): q_pos_offset - k_pos_offset, in a third of the cases.
    const int ps = c % 3 == 1 ? std::uniform_int_distribution<int>(-2000, 2000)(rng) : 0;
    check_shape<64, 128>(sq, sk, wl, wr, ps);
    check_shape<128, 128>(sq, sk, wl, wr, ps);
    check_shape<32, 64>(sq, sk, wl, wr, ps);
    check_shape<64, 64>(sq, sk, wl, wr, ps);
  }
  std::printf("seed %u: %d cases x 4 tiles, %d failures\n", seed, cases, failures);
  return failures == 0 ? 0 : 1;
}
