// A CTA's block-sparse tile list (params.h's block masks), built by one warp, for the CUDA
// kernels. The CTA owns one tile along its own axis (the forward: kernel query rows; the
// backward: kernel key rows) and visits kernel tiles along the other axis, which the mask's
// compressed form lists per mask block of the own axis: `num[c + own_block]` entries of
// `idx[(c + own_block) * n_other + t]`, each a mask block of the other axis.
//   Nesting block sizes (each mask block a whole number of kernel tiles on both axes): the
//   tiles of the own tile's one mask block, in the mask's order.
//   Any other (multiples of 16): every 16 x 16 unit of a kernel tile lies in one mask block, so
//   a 64-bit keep mask per visited tile (bit 8 * own unit + other unit) is ORed from the kept
//   blocks of the own tile's units (shared atomics) and the tiles whose mask is not empty are
//   listed in ascending order; the kernel drops the units of a partial tile.
// Metadata is clamped (never read or written out of bounds); the count is warp-uniform.
#pragma once
#include <cstdint>

namespace flashattn {

// Every unit of a kernel tile kept, as unit masks are laid out.
template <int kOwnUnits, int kOtherUnits>
constexpr unsigned long long all_units_kept() {
  static_assert(kOwnUnits <= 8 && kOtherUnits <= 8, "block-sparse units: a 64-bit mask per tile");
  unsigned long long m = 0ull;
  for (int r = 0; r < kOwnUnits; ++r) m |= ((1ull << kOtherUnits) - 1ull) << (8 * r);
  return m;
}

// The backward's unit path (S^T orientation: key rows, query columns): a and b, its P^T and
// dS^T fragments (m16 key tiles a x n8 query tiles c, from key n0 and query m0 of the kernel
// tile), zeroed on the units `um` drops (bit 8 * key unit + query unit).
template <int kKeyUnits, int kQueryUnits, int kMT, int kNT>
__device__ __forceinline__ void zero_dropped_units(unsigned long long um, int n0, int m0,
                                                   float (&a)[kMT][kNT][4],
                                                   float (&b)[kMT][kNT][4]) {
  constexpr unsigned long long kAll = all_units_kept<kKeyUnits, kQueryUnits>();
  if ((um & kAll) == kAll) return;
#pragma unroll
  for (int t = 0; t < kMT; ++t) {
    const unsigned key_bits = static_cast<unsigned>(um >> (8 * (n0 / 16 + t)));
#pragma unroll
    for (int c = 0; c < kNT; ++c)
      if (!((key_bits >> ((m0 + c * 8) / 16)) & 1u)) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[t][c][e] = b[t][c][e] = 0.f;
      }
  }
}

// Appends `value` where `keep`, in lane order, at list[cnt...] (never past cap); the new count.
__device__ __forceinline__ int warp_append(bool keep, int value, int* list, int cap, int cnt,
                                           int lane) {
  const unsigned ballot = __ballot_sync(0xffffffffu, keep);
  const int slot = cnt + __popc(ballot & ((1u << lane) - 1u));
  if (keep && slot < cap) list[slot] = value;
  return cnt + __popc(ballot);
}

// Columns [0, cols) of rows [r0, r1) of a 16-bit tensor set to +0 (fp16 and bf16 alike), a
// warp per row (all threads call): varlen rows / keys past the mask that the grid leaves out.
__device__ __forceinline__ void zero_rows_16bit(void* row0, int64_t row_stride, int64_t r0,
                                                int64_t r1, int cols, int warp, int n_warps,
                                                int lane) {
  for (int64_t r = r0 + warp; r < r1; r += n_warps) {
    uint16_t* row = static_cast<uint16_t*>(row0) + r * row_stride;
    for (int c = lane; c < cols; c += 32) row[c] = 0;
  }
}

struct SparseAxes {
  const int* num;       // entries per mask block of the own axis
  const int* idx;       // their mask blocks of the other axis
  int64_t c;            // num's offset of (batch, head)
  int n_own, n_other;   // mask blocks per axis
  int own_block, other_block;  // mask block sizes along each axis
};

// The list of one warp (all 32 lanes call): kernel tiles of the other axis in [t_begin, t_end)
// (kOtherTile wide) for the own tile at own0 (of own_len valid rows). Unit path when
// unit_masks != nullptr (indexed by tile, list_cap of them). Returns the count.
template <int kOwnTile, int kOtherTile>
__device__ int build_sparse_tiles(const SparseAxes& a, int own0, int own_len, int t_begin,
                                  int t_end, int* list, unsigned long long* unit_masks,
                                  int list_cap, int lane) {
  constexpr int kOwnUnits = kOwnTile / 16, kOtherUnits = kOtherTile / 16;
  int cnt = 0;
  if (a.n_own <= 0 || a.n_other <= 0) return 0;
  if (unit_masks == nullptr) {
    const int ob = own0 / a.own_block, subs = a.other_block / kOtherTile;
    if (t_begin >= t_end || ob >= a.n_own) return 0;
    const int64_t c = a.c + ob;
    const int nb = min(max(a.num[c], 0), a.n_other);
    for (int t0 = 0; t0 < nb; t0 += 32) {
      const int t = t0 + lane;
      const int mb = t < nb ? min(max(a.idx[c * a.n_other + t], 0), a.n_other - 1) : -1;
      for (int sub = 0; sub < subs; ++sub) {
        const int tile = mb * subs + sub;
        cnt = warp_append(mb >= 0 && tile >= t_begin && tile < t_end, tile, list, list_cap, cnt,
                          lane);
      }
    }
    return cnt;
  }
  t_end = min(t_end, list_cap);  // the masks are indexed by tile
  if (t_begin >= t_end) return 0;
  for (int j = t_begin + lane; j < t_end; j += 32) unit_masks[j] = 0ull;
  __syncwarp();
  const int units_per_block = a.other_block / 16;
  // Own units of one mask block share its entries: their bits spread over the mask's bytes.
  for (int ou = 0; ou < kOwnUnits && own0 + 16 * ou < own_len;) {
    const int ob = (own0 + 16 * ou) / a.own_block;
    unsigned long long spread = 0ull;
    for (; ou < kOwnUnits && own0 + 16 * ou < own_len && (own0 + 16 * ou) / a.own_block == ob;
         ++ou)
      spread |= 1ull << (8 * ou);
    if (ob >= a.n_own) continue;
    const int64_t c = a.c + ob;
    const int nb = min(max(a.num[c], 0), a.n_other);
    for (int t = lane; t < nb; t += 32) {
      const int mb = min(max(a.idx[c * a.n_other + t], 0), a.n_other - 1);
      for (int u = mb * units_per_block; u < (mb + 1) * units_per_block; ++u) {
        const int j = u / kOtherUnits;
        if (j >= t_begin && j < t_end) atomicOr(&unit_masks[j], spread << (u % kOtherUnits));
      }
    }
  }
  __syncwarp();
  for (int j0 = t_begin; j0 < t_end; j0 += 32) {
    const int j = j0 + lane;
    cnt = warp_append(j < t_end && unit_masks[j] != 0ull, j, list, list_cap, cnt, lane);
  }
  return cnt;
}

}  // namespace flashattn
