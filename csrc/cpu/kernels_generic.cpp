// The portable build of the CPU kernels: 4-lane GCC vectors (SSE2 / NEON), no target flags.
#include <cmath>
#include <cstdint>

#include "../common/mask.h"
#include "../common/seqlen.h"
#include "convert.h"
#include "cpu_util.h"
#include "isa.h"

#define FLASHATTN_CPU_AVX2 0

namespace flashattn::cpu::generic_impl {
#include "vec.h"
#include "gemm.h"
#include "scores.h"
#include "attn_fwd.h"
#include "attn_bwd.h"
#include "kernels_entry.h"
#include "attn_probs.h"
}  // namespace flashattn::cpu::generic_impl

namespace flashattn::cpu::generic {
void fwd(const FwdParams& p, const ParallelFor& pf) { generic_impl::run_fwd(p, pf); }
void bwd(const BwdParams& p, const ParallelFor& pf) { generic_impl::run_bwd(p, pf); }
void probs(const FwdParams& p, const ParallelFor& pf) { generic_impl::run_probs(p, pf); }
}  // namespace flashattn::cpu::generic
