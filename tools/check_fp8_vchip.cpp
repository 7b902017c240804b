// Host check of the FP8 forward's on-chip V^T (csrc/sm90/transpose_v_fp8_sm90.cuh with
// fp8_layout_sm90.h's vchip_* helpers), built and run by tests/test_fp8.py
// (test_sm90_fp8_vchip_transpose). For the kVChip tiles (fwd_tile_fp8's key blocks; the raw V
// stage's chunks of key rows and the V^T stage's chunks of head-dim rows in the row widths of
// fp8_v_raw_row_bytes / fp8_vt_row_bytes, which FwdConfig asserts) and other key-block /
// head-dim pairs, over random V bytes and random
// partial key blocks, it plays the kernel's ops as the PTX ISA defines its instructions:
// ldmatrix.x4.trans (b16; lanes 8 j .. 8 j + 7 give matrix j's row addresses; register j of
// lane l gets column l / 4, rows 2 (l % 4) in the low half and + 1 in the high), __byte_perm,
// stmatrix.x4 (b16; lanes 8 m .. give matrix m's rows; row i is register m of lanes 4 i ..
// 4 i + 3, lane 4 i first). Checked: the three warps' deal takes every op once (one or two ops
// in flight); the offsets of vchip_ld_off / vchip_st_off equal the swizzled addresses of keys
// 32 g + lane and head-dim rows d0 + vchip_st_row; each 8-row phase of either instruction
// touches 8 distinct 16-byte bank groups (no conflict); every byte of V^T is written once, and
// holds the byte of key vt_key_of(column) at its head-dim row, or 0 past `valid` keys.
// CASES random stages per shape, SEED.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "sm90/fp8_layout_sm90.h"
#include "sm90/tile_fwd_sm90.h"

using namespace flashattn;
using namespace flashattn::sm90;

namespace {

int failures = 0;
void expect(bool ok, const char* what, int bn, int dv, int a = 0, int b = 0) {
  if (!ok && ++failures <= 20) std::printf("FAIL %s (bn %d dv %d: %d %d)\n", what, bn, dv, a, b);
}

// __byte_perm(x, y, s) for selectors without the sign-replication bit (0x6420, 0x7531).
uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = uint64_t(x) | (uint64_t(y) << 32);
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= uint32_t((v >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
  return r;
}

// Distinct 16-byte bank groups ((address / 16) % 8) among one phase's 8 row addresses.
bool conflict_free(const uint32_t (&rows)[8]) {
  int seen = 0;
  for (uint32_t a : rows) seen |= 1 << ((a / 16) % 8);
  return seen == 0xff;
}

// One stage: kBN keys x kDv head-dim bytes, raw chunks of raw_w-byte rows, V^T chunks of
// vt_w-byte rows, `valid` keys kept.
void check_stage(int bn, int dv, int raw_w, int vt_w, int valid, int ilp, std::mt19937& rng) {
  const int raw_chunk = bn * raw_w, vt_chunk = dv * vt_w, bytes = bn * dv;
  std::vector<uint8_t> v(bytes), raw(bytes, 0), vt(bytes, 0);
  std::vector<int> written(bytes, 0), raw_hit(bytes, 0);
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  auto raw_at = [&](int key, int d) {
    return (d / raw_w) * raw_chunk + vchip_swz(raw_w, key, d % raw_w);
  };
  auto vt_at = [&](int d, int col) {
    return (col / vt_w) * vt_chunk + vchip_swz(vt_w, d, col % vt_w);
  };
  for (int key = 0; key < bn; ++key)
    for (int d = 0; d < dv; ++d) {
      const uint32_t a = raw_at(key, d);
      expect(a < uint32_t(bytes) && ++raw_hit[a] == 1, "raw layout is a bijection", bn, dv, key, d);
      if (a < uint32_t(bytes)) raw[a] = v[key * dv + d];
    }
  const int groups = bn / 32, ops = groups * (dv / 16);
  std::vector<int> taken(ops, 0);
  for (int w = 0; w < 3; ++w)  // the kernel's deal: op0 = w, w + 3 ilp, ...; op = op0 + 3 u
    for (int op0 = w; op0 < ops; op0 += 3 * ilp)
      for (int u = 0; u < ilp; ++u)
        if (u == 0 || op0 + 3 * u < ops) ++taken[op0 + 3 * u];
  for (int op = 0; op < ops; ++op)
    expect(taken[op] == 1, "the deal takes each op once", bn, dv, op);

  for (int op = 0; op < ops; ++op) {
    const uint32_t g = op % groups, d0 = 16 * (op / groups);
    uint32_t ld[32], st[32], reg[32][4], word[32][4];
    for (int lane = 0; lane < 32; ++lane) {
      const VchipLane ln = vchip_lane(raw_w, vt_w, lane);
      ld[lane] = vchip_ld_off(ln, raw_w, raw_chunk, g, d0);
      st[lane] = vchip_st_off(ln, vt_w, vt_chunk, g, d0);
      expect(ld[lane] == raw_at(32 * g + lane, d0), "ldmatrix row address", bn, dv, op, lane);
      expect(st[lane] == vt_at(d0 + vchip_st_row(lane), 32 * g + vchip_st_col(lane)),
             "stmatrix row address", bn, dv, op, lane);
      expect(ld[lane] % 16 == 0 && st[lane] % 16 == 0 && ld[lane] + 16 <= uint32_t(bytes) &&
                 st[lane] + 16 <= uint32_t(bytes),
             "16-byte rows inside the stage", bn, dv, op, lane);
    }
    for (int m = 0; m < 4; ++m) {
      uint32_t lrows[8], srows[8];
      for (int i = 0; i < 8; ++i) lrows[i] = ld[8 * m + i], srows[i] = st[8 * m + i];
      expect(conflict_free(lrows), "ldmatrix phase without bank conflicts", bn, dv, op, m);
      expect(conflict_free(srows), "stmatrix phase without bank conflicts", bn, dv, op, m);
    }
    if (failures) return;
    // ldmatrix.x4.trans, the mask, the permutes.
    for (int t = 0; t < 32; ++t)
      for (int j = 0; j < 4; ++j) {
        auto b16 = [&](int row, int col) {  // matrix j's element (row, col): 2 bytes of a row
          const uint32_t a = ld[8 * j + row] + 2 * col;
          return uint32_t(raw[a]) | (uint32_t(raw[a + 1]) << 8);
        };
        const uint32_t r = b16(2 * (t % 4), t / 4) | (b16(2 * (t % 4) + 1, t / 4) << 16);
        reg[t][j] = vchip_mask(r, 32 * g + 8 * j + 2 * (t % 4), valid);
      }
    for (int t = 0; t < 32; ++t) {
      const uint32_t s0 = vchip_sel(t, 0), s1 = vchip_sel(t, 1);
      word[t][0] = byte_perm(reg[t][0], reg[t][1], s0);
      word[t][1] = byte_perm(reg[t][0], reg[t][1], s1);
      word[t][2] = byte_perm(reg[t][2], reg[t][3], s0);
      word[t][3] = byte_perm(reg[t][2], reg[t][3], s1);
    }
    // stmatrix.x4.
    for (int m = 0; m < 4; ++m)
      for (int i = 0; i < 8; ++i)
        for (int q = 0; q < 4; ++q)
          for (int byte = 0; byte < 4; ++byte) {
            const uint32_t a = st[8 * m + i] + 4 * q + byte;
            vt[a] = static_cast<uint8_t>(word[4 * i + q][m] >> (8 * byte));
            ++written[a];
          }
  }
  for (int d = 0; d < dv; ++d)
    for (int col = 0; col < bn; ++col) {
      const int key = vt_key_of(col);
      const uint32_t a = vt_at(d, col);
      const uint8_t want = key < valid ? v[key * dv + d] : 0;
      expect(written[a] == 1, "each V^T byte written once", bn, dv, d, col);
      expect(vt[a] == want, "V^T byte = V[vt_key_of(column)][row]", bn, dv, d, col);
    }
}

}  // namespace

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 20;
  std::mt19937 rng(argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 1);
  // The kernels that transpose on chip (launch_fwd_sm90.cuh: FwdConfigFp8<kD, kDv, 1>, the
  // tiles of fwd_tile_fp8; FwdConfig asserts the row widths), every key block full once, then
  // random partial ones; then other key blocks and head dims the helpers take.
  for (int i = 0; i < kNumFwdVariants; ++i) {
    const int dv = kFwdHeadDimsV[i], bn = fwd_tile_fp8(kFwdHeadDimsQK[i], dv).block_n;
    for (int c = 0; c < cases; ++c)
      for (int ilp = 1; ilp <= 2; ++ilp)
        check_stage(bn, dv, fp8_v_raw_row_bytes(dv), fp8_vt_row_bytes(bn),
                    c == 0 ? bn : 1 + static_cast<int>(rng() % bn), ilp, rng);
  }
  for (int bn : {64, 128, 192, 256})
    for (int dv : {64, 128, 192, 256})
      for (int c = 0; c < 3; ++c)
        check_stage(bn, dv, fp8_v_raw_row_bytes(dv), fp8_vt_row_bytes(bn),
                    1 + static_cast<int>(rng() % bn), 2, rng);
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
