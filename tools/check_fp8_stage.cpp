// Host check of the FP8 forward's staged layouts (csrc/sm90/fp8_layout_sm90.h), built and run
// by tests/test_fp8.py (test_sm90_fp8_stage_layout): vt_col_of / vt_key_of are inverse permutations of each group of
// 32 keys; every byte of the e4m3 P registers (fp8_pack_idx) holds the row half and the key
// that the k32 A fragment's layout wants at its column (the PTX ISA's: register r, byte i at
// row g + 8 (r & 1), column 4 (lane % 4) + i + 16 (r >> 1)) once V^T's columns are permuted;
// each S element of a slab is packed once; over random varlen metadata (malformed included:
// clamped as seq_info does), the sequences' V^T regions (vt_seq_col0) are 128-aligned, their
// written keys inside the pitch fp8_stage_of sizes, and, rounded up to the widest key block a
// tile reads (fwd_fp8_block_n_max), disjoint where the sequences are.
// CASES random varlen batches, SEED.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "sm90/fp8_layout_sm90.h"

using namespace flashattn;
using namespace flashattn::sm90;

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 200;
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 1;
  int bad = 0;
  for (int key = 0; key < 4096; ++key) {
    const int col = vt_col_of(key);
    if (vt_key_of(col) != key || col / 32 != key / 32) ++bad;
  }
  for (int t = 0; t < 4; ++t) {
    std::vector<int> used(16, 0);
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 4; ++i) {
        constexpr int kTable[4][4] = {{0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}};
        const int idx = fp8_pack_idx(r, i), j = idx / 4, e = idx % 4;
        if (idx != kTable[r][i]) ++bad;  // the documented table
        ++used[idx];
        const int key = 8 * j + 2 * t + (e & 1);     // the S element's key in the slab
        const int col = 4 * t + i + 16 * (r >> 1);   // the A fragment's column there
        if ((e >> 1) != (r & 1)) ++bad;               // its row half
        if (vt_key_of(col) != key) ++bad;             // V^T's column `col` holds that key
      }
    for (int u : used)
      if (u != 1) ++bad;
  }
  std::mt19937 rng(seed);
  for (int c = 0; c < cases; ++c) {
    const int batch = 1 + static_cast<int>(rng() % 9);
    std::vector<int32_t> cu(batch + 1, 0);
    const bool malformed = rng() % 4 == 0;
    for (int b = 1; b <= batch; ++b)
      cu[b] = malformed ? static_cast<int32_t>(rng() % 300)
                        : cu[b - 1] + static_cast<int32_t>(rng() % 3 == 0 ? 0 : rng() % 150);
    FwdParams p;
    p.is_varlen = true;
    p.batch = batch;
    p.total_k = malformed ? 1 + static_cast<int64_t>(rng() % 300) : cu[batch];
    p.total_q = 1;
    p.seqlen_k = 1;
    p.nheads = p.nheads_k = 1;
    p.headdim = p.headdim_v = 64;
    p.cu_seqlens_k = cu.data();
    p.cu_seqlens_q = cu.data();
    const int64_t pitch = fp8_stage_of(p, false).vt_pitch;
    if (pitch % 32 != 0) ++bad;
    std::vector<int64_t> row0(batch), len(batch), c0(batch);
    for (int b = 0; b < batch; ++b) {
      const SeqInfo si = seq_info(p, b);
      row0[b] = si.k_row0, len[b] = si.seqlen_k, c0[b] = vt_seq_col0(si.k_row0, b);
      // The written keys (rounded to 32) stay in the pitch (TMA reads past it as zeros).
      const int64_t end = c0[b] + (len[b] + 31) / 32 * 32;
      if (c0[b] % 128 != 0 || end > pitch) ++bad;
    }
    // A sequence after another in the batch and in k (well-formed ones) gets a region past
    // the other's (malformed ones may share keys and regions: wrong numbers, in bounds).
    for (int a0 = 0; a0 < batch; ++a0)
      for (int b = a0 + 1; b < batch; ++b)
        if (row0[b] >= row0[a0] + len[a0] &&
            c0[b] < c0[a0] + round_up(len[a0], fwd_fp8_block_n_max()))
          ++bad;
  }
  // The worst alignments: a sequence of every length below 1024 from every start mod 256, the
  // next right after it: its last key block (fwd_fp8_block_n_max keys from its region's
  // start, rounded) ends before the next region.
  for (int64_t r0 = 0; r0 < 256; ++r0)
    for (int64_t len = 1; len < 1024; ++len)
      if (vt_seq_col0(r0 + len, 1) - vt_seq_col0(r0, 0) < round_up(len, fwd_fp8_block_n_max()))
        ++bad;
  std::printf("fp8 stage layout: %d cases, %d failures\n", cases, bad);
  return bad == 0 ? 0 : 1;
}
