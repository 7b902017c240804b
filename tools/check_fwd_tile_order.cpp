// Host check of the Hopper forward's tile deals (csrc/sm90/tile_order_sm90.h), built and run by
// tests/test_fwd_tile_order.py: over random list sizes and grids, every tile goes to exactly one
// CTA, none past the list, none after a CTA's first kNoTile (the kernel stops there); then the
// causal makespan of each deal over the ideal (a schedule model: a tile costs its key blocks
// plus a fixed cost) on the benchmark's cells, where the pair deal must stay within 10%.
// Usage: check_fwd_tile_order CASES SEED
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "sm90/tile_order_sm90.h"

using namespace flashattn::sm90;

static int check_cover(int m_blocks, int pairs, int ctas, int deal) {
  const int num_tiles = m_blocks * pairs;
  std::vector<int> seen(num_tiles, 0);
  int bad = 0;
  for (int cta = 0; cta < ctas; ++cta) {
    bool ended = false;
    for (int k = 0; k < 2 * num_tiles + 4; ++k) {
      const int t = fwd_tile_of(k, cta, ctas, num_tiles, m_blocks, deal);
      if (t == kNoTile) { ended = true; continue; }
      if (t == kSkipTile) continue;
      if (t < 0 || t >= num_tiles || ended) { ++bad; continue; }
      ++seen[t];
    }
    if (!ended) ++bad;
  }
  for (int s : seen) bad += s != 1;
  if (bad)
    std::printf("FAIL deal %d m_blocks %d pairs %d ctas %d: %d bad\n", deal, m_blocks, pairs,
                ctas, bad);
  return bad != 0;
}

// Makespan of a causal square problem over the ideal: tile at list position r of its pair
// (query block m_blocks - 1 - r) costs its key blocks of bn keys (in units of 128 keys) + fixed.
static double causal_makespan(int n, int bm, int bn, int pairs, int ctas, int deal) {
  const int m_blocks = (n + bm - 1) / bm, num_tiles = m_blocks * pairs;
  const double fixed = 2.0;
  auto cost = [&](int t) {
    const int m = m_blocks - 1 - t % m_blocks, last = std::min((m + 1) * bm, n) - 1;
    return (last / bn + 1) * bn / 128.0 + fixed;
  };
  double total = 0, worst = 0;
  for (int t = 0; t < num_tiles; ++t) total += cost(t);
  for (int cta = 0; cta < ctas; ++cta) {
    double load = 0;
    for (int k = 0;; ++k) {
      const int t = fwd_tile_of(k, cta, ctas, num_tiles, m_blocks, deal);
      if (t == kNoTile) break;
      if (t >= 0) load += cost(t);
    }
    worst = std::max(worst, load);
  }
  return worst / (total / ctas);
}

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 300;
  const unsigned seed = argc > 2 ? unsigned(std::atoll(argv[2])) : 1u;
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    const int m_blocks = pick(1, i % 3 == 0 ? 8 : 200), pairs = pick(1, 40);
    const int ctas = pick(1, i % 4 == 0 ? 8 : 300);
    for (int deal : {int(kDealSnake), int(kDealPairs)})
      failures += check_cover(m_blocks, pairs, ctas, deal);
  }
  struct Dim { int d, bm, bn; };
  for (const Dim& dim : {Dim{64, 192, 128}, Dim{128, 128, 128}, Dim{256, 128, 80}})
    for (int n = 512; n <= 16384; n *= 2) {
      const int pairs = (16384 / n) * (2048 / dim.d);  // B * H of the benchmark's cell
      const double snake = causal_makespan(n, dim.bm, dim.bn, pairs, 132, kDealSnake);
      const double paired = causal_makespan(n, dim.bm, dim.bn, pairs, 132, kDealPairs);
      std::printf("d%-3d N %-5d causal makespan / ideal: snake %.3f pairs %.3f\n", dim.d, n,
                  snake, paired);
      if (paired > 1.10) {
        std::printf("FAIL pairs above 1.10\n");
        ++failures;
      }
    }
  std::printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
