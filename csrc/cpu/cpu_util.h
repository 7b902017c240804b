// Instruction-set independent helpers of the CPU backend: tile sizes, scratch buffers and
// the task scheduler. Torch-free.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "../common/philox.h"
#include "../common/seqlen.h"
#include "../common/tile_policy.h"
#include "cpu_backend.h"

namespace flashattn::cpu {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

inline constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Forward: a task is (batch, head, bm query rows) streaming key tiles of 64 columns. Every
// task re-reads (and packs) K and V, so larger bm is faster: 256 rows beat 128 by ~20% on
// Zen 3 at d = 64, N = 4k. Head dims over 128 use 128 to keep the tiles within L2; small
// problems halve bm until there are enough tasks for the threads, and a two-sided window
// halves it while the tile is much taller than the window (a tile computes bm + window keys).
inline constexpr int kFwdBlockN = 64;
inline int fwd_block_m(const FwdParams& p, int64_t batch_heads, int max_seqlen_q) {
  constexpr int64_t kMinTasks = 32;
  int bm = (p.headdim > 128 || p.headdim_v > 128) ? 128 : 256;
  while (bm > 64 && batch_heads * ((max_seqlen_q + bm - 1) / bm) < kMinTasks) bm /= 2;
  if (p.window_left >= 0 && p.window_right >= 0) {
    const int64_t span = int64_t(p.window_left) + p.window_right + 1;
    while (bm > 64 && bm > 2 * span) bm /= 2;
  }
  return bm;
}
// Backward: a task is (batch, kv head, split) and walks bn-key tiles x 64-query tiles; every
// key tile re-reads Q and dO, so 128 keys (~8% faster than 64 at d = 64 on Zen 3) unless the
// head dims exceed 128 (then 64, to keep the K, V, dK, dV tiles within L2).
inline constexpr int kBwdBlockM = 64;
inline constexpr int kBwdBlockNMax = 128;
// Block-sparse (q_num_blocks set): bn = block_n, one key tile per key block.
inline int bwd_block_n(const BwdParams& p) {
  if (p.q_num_blocks) return p.block_n;
  return (p.headdim > 128 || p.headdim_v > 128) ? 64 : kBwdBlockNMax;
}
// Padded head dims of the fp32 scratch tiles and of the dQ workspace rows.
inline constexpr int kColPad = 16;

// Backward splits of each (batch, kv head)'s key tiles: enough tasks to keep a many-core
// machine busy, each split with its own fp32 dQ copy, capped at 64 Mi floats of workspace.
// A function of the shapes only, so the summation order never depends on the machine.
inline int bwd_num_splits(const BwdParams& p) {
  constexpr int64_t kTargetTasks = 32, kMaxWorkspaceElems = int64_t(1) << 26;
  const int64_t units = int64_t(p.batch) * p.nheads_k;
  const int bn = bwd_block_n(p);
  const int64_t n_kblocks = (int64_t(p.seqlen_k) + bn - 1) / bn;
  int64_t g = units > 0 ? (kTargetTasks + units - 1) / units : 1;
  g = g < n_kblocks ? g : n_kblocks;
  const int64_t per_split = p.total_q * p.nheads * round_up(p.headdim, kColPad);
  if (per_split > 0 && g * per_split > kMaxWorkspaceElems) g = kMaxWorkspaceElems / per_split;
  return static_cast<int>(g < 1 ? 1 : g);
}

// Sequence b's position offsets (params.h), clamped to [0, kMaxPosOffset]; 0 without them.
inline int64_t q_pos_offset(const FwdParams& p, int b) {
  return p.q_pos_offset ? clamp_i64(p.q_pos_offset[b], 0, kMaxPosOffset) : 0;
}
inline int64_t k_pos_offset(const FwdParams& p, int b) {
  return p.k_pos_offset ? clamp_i64(p.k_pos_offset[b], 0, kMaxPosOffset) : 0;
}

// The CPU kernels' view of the causal / window mask of sequence b: common/mask.h's MaskInfo
// with the position offsets folded into the diagonal (query i sits at key i + diag, diag =
// sk - sq + q_pos_offset - k_pos_offset; params.h), in 64-bit so that no offset overflows.
// The CUDA kernels keep MaskInfo (they refuse offsets). MaskInfo's key / query ranges.
struct CpuMask {
  int32_t seqlen_q, seqlen_k;
  int32_t window_left, window_right;  // -1 = unbounded
  int64_t diag;                       // the shift

  int32_t key_begin(int32_t i) const {
    return window_left >= 0 ? static_cast<int32_t>(clamp_i64(i + diag - window_left, 0, seqlen_k))
                            : 0;
  }
  int32_t key_end(int32_t i) const {
    return window_right >= 0
               ? static_cast<int32_t>(clamp_i64(i + diag + window_right + 1, 0, seqlen_k))
               : seqlen_k;
  }
  int32_t query_begin(int32_t j) const {
    return window_right >= 0
               ? static_cast<int32_t>(clamp_i64(j - diag - window_right, 0, seqlen_q))
               : 0;
  }
  int32_t query_end(int32_t j) const {
    return window_left >= 0
               ? static_cast<int32_t>(clamp_i64(j - diag + window_left + 1, 0, seqlen_q))
               : seqlen_q;
  }
};

inline CpuMask cpu_mask(const FwdParams& p, const SeqInfo& s, int b) {
  return CpuMask{s.seqlen_q, s.seqlen_k, p.window_left, p.window_right,
                 int64_t(s.seqlen_k) - s.seqlen_q + q_pos_offset(p, b) - k_pos_offset(p, b)};
}

// Dropout (params.h, philox.h) on rows [i0, i0 + m), columns [j0, j0 + n) of (b, h), the
// tile x (row stride ld, x[0] = cell (i0, j0)): x *= kept ? keep_factor : drop_factor. One
// Philox call per unit (16 cells) the tile touches. (i0, j0) are sequence-local; the mask is
// that of the positions (i0 + q_pos_offset, j0 + k_pos_offset) (params.h).
inline void dropout_tile(const FwdParams& p, int b, int h, int i0_local, int m, int j0_local,
                         int n, float keep_factor, float drop_factor, float* x, int64_t ld) {
  const uint64_t seed = static_cast<uint64_t>(p.rng_state[0]);
  const uint64_t offset = static_cast<uint64_t>(p.rng_state[1]);
  const int64_t i0 = i0_local + q_pos_offset(p, b), j0 = j0_local + k_pos_offset(p, b);
  const int64_t i1 = i0 + m, j1 = j0 + n;
  for (int64_t I = i0 >> 4; I <= (i1 - 1) >> 4; ++I)
    for (int64_t J = j0 >> 4; J <= (j1 - 1) >> 4; ++J)
      for (int u = 0; u < 16; ++u) {
        const int q = u >> 2, t = u & 3;
        const Philox4 bits = dropout_bits(seed, offset, b, h, static_cast<int32_t>(I),
                                          static_cast<int32_t>(J), u);
        for (int rr = 0; rr < 4; ++rr) {
          const int r = 2 * q + (rr & 1) + 8 * (rr >> 1);
          const int64_t i = 16 * I + r;
          if (i < i0 || i >= i1) continue;
          const uint32_t word = bits.x[dropout_word(r)];
          float* row = x + int64_t(i - i0) * ld - j0;
          for (int cc = 0; cc < 4; ++cc) {
            const int c = 2 * t + (cc & 1) + 8 * (cc >> 1);
            const int64_t j = 16 * J + c;
            if (j < j0 || j >= j1) continue;
            const uint32_t byte = (word >> (8 * dropout_byte_in_word(c))) & 0xffu;
            row[j] *= byte >= p.dropout_threshold ? keep_factor : drop_factor;
          }
        }
      }
}

// The sink's natural-log logit of head h in log2 units, or -inf without a sink.
inline float sink_log2(const FwdParams& p, int h) {
  return p.sink_ptr ? p.sink_ptr[h] * kLog2e : -__builtin_inff();
}

// Asks for rows [0, n) of a strided matrix (row_bytes each) to be brought into L2 while the
// current tile computes: rows of one head are a head-stride apart, too far for the hardware
// prefetcher to run ahead of the next tile's packing.
inline void prefetch_rows(const void* base, int64_t row_stride_bytes, int n, int row_bytes) {
  const char* p = static_cast<const char*>(base);
  for (int r = 0; r < n; ++r, p += row_stride_bytes)
    for (int c = 0; c < row_bytes; c += 64) __builtin_prefetch(p + c, 0, 1);
}

// A 64-byte aligned fp32 scratch buffer, one per worker invocation (fixed size per tile,
// never proportional to the sequence length).
class Scratch {
 public:
  explicit Scratch(int64_t elems) {
    const size_t bytes = (static_cast<size_t>(elems) * sizeof(float) + 63) / 64 * 64;
    ptr_ = static_cast<float*>(std::aligned_alloc(64, bytes ? bytes : 64));
    if (!ptr_) throw std::bad_alloc();
  }
  ~Scratch() { std::free(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return ptr_; }

 private:
  float* ptr_ = nullptr;
};

// Runs task(t, scratch) for every t in [0, n) exactly once. Workers pull tasks from a shared
// counter (dynamic balancing: causal tiles differ in cost). Every task writes only its own
// outputs in a fixed order, so the result does not depend on which worker ran it.
template <typename Task>
void run_tasks(const ParallelFor& parallel_for, int64_t n, int64_t scratch_elems,
               const Task& task) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  parallel_for(n, [&](int64_t begin, int64_t end) {
    if (begin >= end || next.load(std::memory_order_relaxed) >= n) return;
    Scratch scratch(scratch_elems);
    for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) task(t, scratch.get());
  });
}

}  // namespace flashattn::cpu
