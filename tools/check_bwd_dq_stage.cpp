// Host check of the Hopper backward's dQ staging order (csrc/sm90/bwd_layout_sm90.h,
// dq_stage_slot), built and run by tests/test_bwd_order.py: for the d64 / d128 kernel's 64
// columns and the d256 kernel's 128, with and without the swap, every thread stores each of
// its n8 blocks once and lands where the plain order puts that block (the reduce box's
// layout); the whole block is written once; with the swap, every half-warp's STS.64 of a step
// covers 32 distinct banks (one wavefront), without it 16 (two). CASES, SEED unused (the check
// is exhaustive); kept for run_host_check's interface.
#include <cstdio>
#include <set>
#include <vector>

#include "sm90/bwd_layout_sm90.h"

using namespace flashattn::sm90;

static int check(int cols, bool swap) {
  constexpr int kChunk = 64 * 128;
  int bad = 0;
  std::vector<int> hits(cols / 32 * kChunk / 8, 0);
  for (int warp = 0; warp < 4; ++warp)
    for (int lane = 0; lane < 32; ++lane) {
      std::set<int> blocks;
      for (int j = 0; j < cols / 8; ++j)
        for (int r = 0; r < 2; ++r) {
          const DqStageSlot s = dq_stage_slot(j, r, warp, lane, kChunk, swap);
          const DqStageSlot plain = dq_stage_slot(s.block, r, warp, lane, kChunk, false);
          if (s.offset != plain.offset || plain.block != s.block) ++bad;  // where it belongs
          if (r == 0) blocks.insert(s.block);
          if (s.offset % 8 != 0 || s.offset / 8 >= hits.size()) { ++bad; continue; }
          ++hits[s.offset / 8];
        }
      if (int(blocks.size()) != cols / 8) ++bad;  // each n8 block once
    }
  for (int h : hits) bad += h != 1;  // every 8 bytes of the stage written once
  // Banks of one step's STS.64 per half-warp (warp 0; the others differ by whole rows).
  for (int j = 0; j < cols / 8; ++j)
    for (int r = 0; r < 2; ++r)
      for (int half = 0; half < 2; ++half) {
        std::set<int> banks;
        for (int lane = 16 * half; lane < 16 * half + 16; ++lane) {
          const uint32_t off = dq_stage_slot(j, r, 0, lane, kChunk, swap).offset;
          banks.insert(off / 4 % 32);
          banks.insert(off / 4 % 32 + 1);
        }
        if (int(banks.size()) != (swap ? 32 : 16)) ++bad;
      }
  return bad;
}

int main() {
  int failures = 0;
  for (int cols : {64, 128})
    for (bool swap : {false, true}) {
      const int bad = check(cols, swap);
      std::printf("dQ stage, %d columns, swap %d: %d bad\n", cols, int(swap), bad);
      failures += bad;
    }
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
