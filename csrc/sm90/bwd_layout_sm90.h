// Index math of the Hopper backward that the host can check (tools/check_bwd_dq_stage.cpp,
// tests/test_bwd_order.py): where a consumer thread stores its dQ block for the TMA reduce-add
// (kernel_bwd_sm90.cuh, bwd_stage_dq), which query blocks a key block's CTA visits, and the
// deterministic mode's turn of a key block at a query block (bwd_dq_warp).
#pragma once
#include <cstdint>

#include "../common/mask.h"
#include "../common/seqlen.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn::sm90 {

// The dQ block, an m64nkCols fp32 accumulator (rows warp * 16 + lane / 4 + 8 r, n8 block j's
// columns j * 8 + (lane % 4) * 2 and + 1), staged as the reduce box lays it out: 32-column
// chunks of chunk_bytes, 128-byte rows, 16-byte unit XOR row % 8. For one j the 16 lanes of a
// half-warp (rows g = lane / 4 of 0-3) would fill only 4 of a row's 8 units, each twice (16
// banks, two wavefronts an STS.64); with swap, lanes of odd g store n8 block j ^ 2 at step j
// (the same chunk, the other 4 units), so each half-warp store covers the 32 banks once.
struct DqStageSlot {
  int block;        // the n8 block whose pair this step stores
  uint32_t offset;  // its byte offset in the stage
};
FLASHATTN_HOST_DEVICE DqStageSlot dq_stage_slot(int j, int r, int warp, int lane,
                                                int chunk_bytes, bool swap) {
  const int g = lane / 4;
  const int js = swap && (g & 1) ? j ^ 2 : j;
  const int row = warp * 16 + g + 8 * r;
  const int unit = (js % 4) * 2 + (lane % 4) / 2;
  return DqStageSlot{js, static_cast<uint32_t>((js / 4) * chunk_bytes + row * 128 +
                                               ((unit ^ g) * 16) + (lane % 2) * 8)};
}

// The query blocks (of block_m rows) key block n_block (of block_n keys, n0 < seqlen_k) visits:
// [m_lo, m_lo + count), the blocks holding a query that sees one of its keys (one interval).
struct QueryBlockRange {
  int m_lo, count;
};
FLASHATTN_HOST_DEVICE QueryBlockRange bwd_query_blocks(const MaskInfo& mi, int n_block,
                                                       int block_m, int block_n) {
  const int n0 = n_block * block_n;
  const int n_last = (n0 + block_n < mi.seqlen_k ? n0 + block_n : mi.seqlen_k) - 1;
  const int q_lo = mi.query_begin(n0), q_hi = mi.query_end(n_last);
  const int m_lo = q_lo / block_m;
  return QueryBlockRange{m_lo, q_hi > q_lo ? (q_hi + block_m - 1) / block_m - m_lo : 0};
}

// Deterministic mode: the key blocks that visit a query block add into its dQ one at a time in
// a fixed order, each waiting on the block's semaphore for its turn (bwd_dq_warp). Two orders:
// - the diagonal order, for masks that bound keys on the right only (causal; bwd_det_diag; the
//   default since 2026-12-07; FLASHATTN_SM90_DET_DIAG=0 takes the index order): FA3's order. Key
//   blocks are dispatched from the last down (bwd_det_n_block), each visits its query blocks from
//   its diagonal up, and at a query block the higher key blocks add first. Key block n reaches
//   query block m at its step m - m_lo(n), the later the lower n: arrivals come in turn order, and
//   the key blocks resident together are at different query blocks at any time. (In the other order
//   every resident key block of a (head, sequence) starts at the last query block, so their adds
//   there go one after another: H100, d 256 causal, 0.69 of the default.)
// - otherwise: key blocks dispatched in index order, each visiting its query blocks from the
//   last down, the lower key blocks adding first (with a left window the key blocks' last query
//   blocks differ, which staggers them).
// Either way a key block waits only on key blocks dispatched before it, so the waits end.
FLASHATTN_HOST_DEVICE bool bwd_det_diag(int window_left, int window_right) {
  return window_right >= 0 && window_left < 0;
}
FLASHATTN_HOST_DEVICE bool bwd_det_diag(const MaskInfo& mi) {
  return bwd_det_diag(mi.window_left, mi.window_right);
}
// The key block of launch position n_block (of nb) of a (head, sequence) pair.
FLASHATTN_HOST_DEVICE int bwd_det_n_block(int n_block, int nb, bool diag) {
  return diag ? nb - 1 - n_block : n_block;
}
// The query block of step it of a key block visiting [m_lo, m_lo + count): from the last down,
// or (diag, and every non-deterministic call) from the first up.
FLASHATTN_HOST_DEVICE int bwd_visit_block(int it, int m_lo, int count, bool descending) {
  return descending ? m_lo + count - 1 - it : m_lo + it;
}
// Key block n_block's turn among the key blocks that visit query block m (rows m0 .. m0 +
// block_m - 1). diag (the diagonal order, only where bwd_det_diag): the block's last key block,
// that of its last row's last visible key, minus n_block. Otherwise n_block minus the block's
// first key block, that of its first row that sees a key (rows above -shift - window_right see
// none; their key_begin, clamped to 0, would count key blocks that never visit the block).
FLASHATTN_HOST_DEVICE int bwd_det_turn(const MaskInfo& mi, int m0, int n_block, int block_m,
                                       int block_n, bool diag) {
  if (diag) {
    const int r1 = (m0 + block_m < mi.seqlen_q ? m0 + block_m : mi.seqlen_q) - 1;
    return (mi.key_end(r1) - 1) / block_n - n_block;
  }
  int r = m0;
  if (mi.window_right >= 0 && r < -mi.shift() - mi.window_right) r = -mi.shift() - mi.window_right;
  return n_block - mi.key_begin(r) / block_n;
}

// Deterministic calls with two dQ warps (bwd_dq_warp, BwdArgs::det_dq_warps 2): iteration it is
// taken by dQ warp it % 2, which the warp of iteration it - 1 hands the consumers' dQ stages
// over to on named barrier kBarDQHand + bwd_dq_hand_barrier(it): one barrier per receiving
// warp. (On a single one, a warp's arrive handing it + 1 over and its own sync before it + 2
// could complete the barrier alone while the other warp still waited for its turn at it + 1;
// the two then took each other's blocks, and could end waiting on the barrier for ever.
// tools/check_bwd_det_sm90.cpp simulates both.)
FLASHATTN_HOST_DEVICE int bwd_dq_hand_barrier(int it) { return it % 2; }

}  // namespace flashattn::sm90
