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
// And the two dQ warps' hand-over (bwd_dq_hand_barrier) over random interleavings.
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

// The two dQ warps' hand-over (bwd_dq_warp under det_dq_warps 2), simulated with the named
// barriers' counting (bar.arrive adds a warp's 32 threads and goes on; bar.sync adds them and
// waits; a barrier completes when its count reaches the expected threads, whoever arrived,
// and starts again). Parties: the consumers (one warpgroup, 128 threads, as both consumers'
// barriers behave alike) and dQ warps 0 and 1. The consumers, per block it: (it > 0) sync on
// Empty (160: the last stage read), write block it, arrive on Full (160). Warp it % 2: its
// semaphore turn (a random delay), (it > 0) sync on the hand-over barrier hand(it) (64), sync
// on Full, read the stage (it must hold block it), then (it + 1 < n) arrive on hand(it + 1),
// arrive on Empty. Random interleavings. Returns a bit set: 1 a warp read another block,
// 2 a deadlock, 4 a barrier's count passed its expected threads in one phase (the hardware's
// behaviour then is not described: a hang, or a phase that never completes).
template <class Hand>
static int simulate_dq_handover(int n_iters, std::mt19937& rng, Hand hand) {
  enum Kind { kDelay, kSync, kArrive, kWrite, kRead };
  struct Op { Kind kind; int arg; };
  const int kFull = 0, kEmpty = 1, kHand = 2;  // barriers kHand + hand(it): 2 and 3
  const int expected[4] = {160, 160, 64, 64}, threads[3] = {128, 32, 32};
  std::vector<std::vector<Op>> prog(3);
  for (int it = 0; it < n_iters; ++it) {
    if (it > 0) prog[0].push_back({kSync, kEmpty});
    prog[0].push_back({kWrite, it});
    prog[0].push_back({kArrive, kFull});
    auto& w = prog[1 + it % 2];
    w.push_back({kDelay, std::uniform_int_distribution<int>(0, 6)(rng)});
    if (it > 0) w.push_back({kSync, kHand + hand(it)});
    w.push_back({kSync, kFull});
    w.push_back({kRead, it});
    if (it + 1 < n_iters) w.push_back({kArrive, kHand + hand(it + 1)});
    w.push_back({kArrive, kEmpty});
  }
  int count[4] = {}, gen[4] = {}, stage = -1, result = 0;
  std::vector<size_t> pc(3, 0);
  std::vector<int> wait_bar(3, -1), wait_gen(3, 0);
  for (;;) {
    std::vector<int> ready;
    for (int e = 0; e < 3; ++e)
      if (pc[e] < prog[e].size() && (wait_bar[e] < 0 || gen[wait_bar[e]] > wait_gen[e]))
        ready.push_back(e);
    if (ready.empty()) {
      for (int e = 0; e < 3; ++e)
        if (pc[e] < prog[e].size()) return result | 2;
      return result;
    }
    const int e = ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng)];
    if (wait_bar[e] >= 0) {  // released: the sync is done
      wait_bar[e] = -1;
      ++pc[e];
      continue;
    }
    Op& op = prog[e][pc[e]];
    switch (op.kind) {
      case kDelay:
        if (op.arg-- > 0) continue;
        break;
      case kWrite: stage = op.arg; break;
      case kRead:
        if (stage != op.arg) result |= 1;
        break;
      case kSync:
      case kArrive: {
        const int b = op.arg, g = gen[b];
        count[b] += threads[e];
        if (count[b] > expected[b]) return result | 4;
        if (count[b] == expected[b]) count[b] = 0, ++gen[b];
        if (op.kind == kSync && gen[b] == g) {  // waits for the barrier's completion
          wait_bar[e] = b, wait_gen[e] = g;
          continue;
        }
        break;
      }
    }
    ++pc[e];
  }
}

// The hand-over over many interleavings: bwd_dq_hand_barrier's must never fail; one shared
// barrier must fail in some (the check can see the race it guards against).
static int check_dq_handover(std::mt19937& rng, int trials) {
  int bad = 0, shared[8] = {};
  for (int t = 0; t < trials; ++t) {
    const int n = 1 + t % 9;
    bad += simulate_dq_handover(n, rng, [](int it) { return bwd_dq_hand_barrier(it); }) != 0;
    ++shared[simulate_dq_handover(n, rng, [](int) { return 0; })];
  }
  const int shared_bad = trials - shared[0];
  int by_kind[3] = {};  // shared-barrier runs with a wrong read, a deadlock, an over-full phase
  for (int r = 1; r < 8; ++r)
    for (int k = 0; k < 3; ++k) by_kind[k] += (r >> k & 1) * shared[r];
  std::printf("dQ hand-over: %d interleavings, %d failures; one shared barrier: %d (a wrong "
              "block read %d, with a deadlock %d, with a barrier over-full %d)\n", trials, bad,
              shared_bad, by_kind[0], by_kind[1], by_kind[2]);
  return bad + (shared_bad == 0);
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
  failures += check_dq_handover(rng, 20 * cases);
  std::printf("%d cases, %d failures\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
