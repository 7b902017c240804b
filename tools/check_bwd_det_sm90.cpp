// Host check of the sm90 deterministic backward's dQ order (csrc/sm90/bwd_layout_sm90.h:
// bwd_query_blocks, bwd_det_turn, bwd_det_n_block, bwd_visit_block), built and run by
// tests/test_bwd_order.py. Over random shapes (sq != sk both ways), causal / windows / none
// and tiles: at every query block the turns of the key blocks that visit it are 0, 1, ...,
// count - 1 (each once: the semaphore reaches every turn); then the waits run to the end in a
// simulation where key blocks are dispatched in the kernels' order (bwd_det_n_block) onto R
// resident slots (R = 1, 2, 7, all) and each visits its query blocks in the kernels' order
// (bwd_visit_block), waiting at each for its turn (no deadlock). With the diagonal order
// (causal) it also checks that the turns follow the arrivals: with every key block resident,
// the only waits are those that stagger key blocks sharing a first query block (sk > sq).
// Usage: check_bwd_det_sm90 CASES SEED
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "sm90/bwd_layout_sm90.h"

using namespace flashattn;
using namespace flashattn::sm90;

static int check_case(const MaskInfo& mi, int bm, int bn, int resident, bool diag) {
  const int nb = (mi.seqlen_k + bn - 1) / bn, mb = (mi.seqlen_q + bm - 1) / bm;
  int bad = 0;
  // Turns: per query block, the visiting key blocks' turns are a permutation of 0..count-1.
  std::vector<std::vector<int>> turns(mb);
  for (int n = 0; n < nb; ++n) {
    const QueryBlockRange q = bwd_query_blocks(mi, n, bm, bn);
    for (int m = q.m_lo; m < q.m_lo + q.count; ++m) {
      if (m < 0 || m >= mb) { ++bad; continue; }
      turns[m].push_back(bwd_det_turn(mi, m * bm, n, bm, bn, diag));
    }
  }
  for (auto& t : turns) {
    std::sort(t.begin(), t.end());
    for (int i = 0; i < int(t.size()); ++i) bad += t[i] != i;
  }
  // The waits: dispatch in the kernels' order, `resident` at a time; in rounds, each CTA at
  // its step waits for the query block's count to reach its turn, then adds one (the counts
  // it reads are those of the round before: every resident CTA moves at once). Must finish.
  std::vector<int> sem(mb, 0), step(nb, 0);
  std::vector<QueryBlockRange> qr(nb);
  for (int n = 0; n < nb; ++n) qr[n] = bwd_query_blocks(mi, n, bm, bn);
  int next = 0, done = 0, waits = 0;
  std::vector<int> running;
  while (done < nb) {
    while (int(running.size()) < resident && next < nb)
      running.push_back(bwd_det_n_block(next++, nb, diag));
    bool progress = false;
    std::vector<int> adds;
    for (size_t i = 0; i < running.size();) {
      const int n = running[i];
      if (step[n] == qr[n].count) {  // finished: leaves its slot
        running.erase(running.begin() + i);
        ++done;
        progress = true;
        continue;
      }
      const int m = bwd_visit_block(step[n], qr[n].m_lo, qr[n].count, !diag);
      if (sem[m] == bwd_det_turn(mi, m * bm, n, bm, bn, diag)) {
        adds.push_back(m);
        ++step[n];
        progress = true;
      } else {
        ++waits;
      }
      ++i;
    }
    for (int m : adds) ++sem[m];
    if (!progress) return bad + 1000;  // a deadlock
  }
  // Diagonal order, every key block resident: a key block arrives at a query block after the
  // key blocks before it in turn have added there, except that g key blocks with the same
  // first query block (those that see query 0, sk > sq) start together: g (g - 1) / 2 waits
  // stagger them once.
  if (diag && resident >= nb) {
    int64_t allowed = 0;
    for (int n = 0, g = 0; n < nb; ++n) {
      g = n > 0 && qr[n].count > 0 && qr[n - 1].count > 0 && qr[n].m_lo == qr[n - 1].m_lo ? g + 1
                                                                                        : 0;
      allowed += g;  // the g-th of a group waits g times
    }
    if (waits > allowed) bad += 1;
  }
  return bad;
}

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 200;
  std::mt19937 rng(argc > 2 ? std::atoi(argv[2]) : 1);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int failures = 0;
  for (int c = 0; c < cases; ++c) {
    // Position offsets (ring attention's chunks) shift the diagonal: pos_shift in some cases.
    MaskInfo mi{uni(1, 1500), uni(1, 1500), -1, -1, uni(0, 2) ? 0 : uni(-2000, 2000)};
    switch (uni(0, 3)) {
      case 0: break;                                                        // none
      case 1: mi.window_right = 0; break;                                   // causal
      case 2: mi.window_left = uni(0, 300); mi.window_right = uni(0, 300); break;
      default: (uni(0, 1) ? mi.window_left : mi.window_right) = uni(0, 400); break;
    }
    const int tiles[][2] = {{64, 128}, {128, 128}, {64, 64}};
    const auto& t = tiles[uni(0, 2)];
    // Both orders where the diagonal one applies (the kernels take it per call).
    for (bool diag : {false, bwd_det_diag(mi)}) {
      for (int resident : {1, 2, 7, 1 << 20}) {
        const int bad = check_case(mi, t[0], t[1], resident, diag);
        if (bad) {
          std::printf("case sq %d sk %d window (%d, %d) shift %d tile %dx%d resident %d diag %d: "
                      "%d bad%s\n", mi.seqlen_q, mi.seqlen_k, mi.window_left, mi.window_right,
                      mi.pos_shift, t[0], t[1], resident, int(diag), bad,
                      bad >= 1000 ? " (deadlock)" : "");
          ++failures;
        }
      }
      if (!bwd_det_diag(mi)) break;
    }
  }
  std::printf("%d cases, %d failures\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
