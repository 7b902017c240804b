// The AVX2 + FMA (+ F16C) build of the CPU kernels: the same templates as kernels_generic.cpp,
// compiled under `#pragma GCC target` (the package is built without -march flags);
// cpu_backend.cpp calls it only where the CPU reports AVX2, FMA and F16C.
#include <cmath>
#include <cstdint>

#include "../common/mask.h"
#include "../common/seqlen.h"
#include "convert.h"
#include "cpu_util.h"
#include "isa.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
// Everything below, and only that (the standard headers above are not retargeted), may use
// AVX2, FMA and F16C: it lives in its own namespace, so no inline function is shared with the
// portable build.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define FLASHATTN_CPU_AVX2 1

namespace flashattn::cpu::avx2_impl {
#include "vec.h"
#include "gemm.h"
#include "scores.h"
#include "attn_fwd.h"
#include "attn_bwd.h"
#include "kernels_entry.h"
}  // namespace flashattn::cpu::avx2_impl

namespace flashattn::cpu::avx2 {
bool compiled() { return true; }
void fwd(const FwdParams& p, const ParallelFor& pf) { avx2_impl::run_fwd(p, pf); }
void bwd(const BwdParams& p, const ParallelFor& pf) { avx2_impl::run_bwd(p, pf); }
}  // namespace flashattn::cpu::avx2
#pragma GCC pop_options

#else
namespace flashattn::cpu::avx2 {
bool compiled() { return false; }
void fwd(const FwdParams& p, const ParallelFor& pf) { generic::fwd(p, pf); }
void bwd(const BwdParams& p, const ParallelFor& pf) { generic::bwd(p, pf); }
}  // namespace flashattn::cpu::avx2
#endif
