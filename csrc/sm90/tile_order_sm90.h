// Which tiles each CTA of the Hopper forward's grid takes, and in what order (host and device:
// tools/check_fwd_tile_order.cpp checks the deals on the host). A tile is kBM query rows of one
// (head, sequence) pair; the list (kernel_fwd_sm90.cuh, fwd_tile_info) runs the pairs in
// groups, within a group from the last query block (the longest under a causal mask) down.
#pragma once
#include <cstdint>

#include "../common/seqlen.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn::sm90 {

// How a grid smaller than the tile list deals the list out (with one CTA per tile, the snake
// gives CTA i tile i; the pairs give CTA i pair i, both its tiles).
enum FwdDeal : int {
  kDealSnake = 0,  // round k of ctas tiles, alternating direction: for equal tiles
  kDealPairs = 1,  // pairs of one (head, sequence): its r-th query block from the top and from
                   // the bottom (longest with shortest under a causal mask, a near-constant
                   // cost); needs the list's groups of one (head, sequence)
};

inline constexpr int kNoTile = -1;    // past the end of this CTA's tiles
inline constexpr int kSkipTile = -2;  // a slot with no tile (an odd count's middle block)

// The k-th tile of CTA `cta` of `ctas`: a position in the list, or kNoTile / kSkipTile.
// Snake: the CTA that takes a round's first tile takes the next round's last. Pairs: the same
// snake over the pairs, each taken as its two tiles, the longer first.
FLASHATTN_HOST_DEVICE int fwd_tile_of(int k, int cta, int ctas, int num_tiles, int m_blocks,
                                      int deal) {
  if (deal != kDealPairs) {
    const int64_t pos = int64_t(k) * ctas + (k % 2 == 0 ? cta : ctas - 1 - cta);
    return pos < num_tiles ? static_cast<int>(pos) : kNoTile;
  }
  // Full pairs (r, m_blocks - 1 - r) of every (head, sequence) first, then an odd count's
  // middle blocks, one per (head, sequence), as lone tiles of half the cost at the end.
  const int full = m_blocks / 2, heads = num_tiles / m_blocks;
  const int64_t n_full = int64_t(heads) * full;
  const int round = k / 2;  // a snake over the pairs too
  const int64_t pair = int64_t(round) * ctas + (round % 2 == 0 ? cta : ctas - 1 - cta);
  if (pair >= n_full + (m_blocks % 2 == 1 ? heads : 0)) return kNoTile;
  if (pair >= n_full) {  // a middle block
    if (k % 2 == 1) return kSkipTile;
    return static_cast<int>(pair - n_full) * m_blocks + full;
  }
  // pair < n_full <= num_tiles < 2^31 here: 32-bit division (a 64-bit one is a long call).
  const int pi = static_cast<int>(pair);
  const int hb = pi / full, q = pi % full;
  const int r = k % 2 == 0 ? q : m_blocks - 1 - q;
  return hb * m_blocks + r;
}

}  // namespace flashattn::sm90
