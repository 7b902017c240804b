// Index math of the Hopper backward's shared-memory stages that the host can check
// (tools/check_bwd_dq_stage.cpp, tests/test_bwd_order.py): where a consumer thread stores its
// dQ block for the TMA reduce-add (kernel_bwd_sm90.cuh, bwd_stage_dq).
#pragma once
#include <cstdint>

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

}  // namespace flashattn::sm90
