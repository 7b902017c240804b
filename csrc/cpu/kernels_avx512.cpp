// The AVX-512 build of the CPU kernels: the same templates as kernels_generic.cpp with 16-lane
// vectors, compiled under `#pragma GCC target` (the package is built without -march flags);
// cpu_backend.cpp calls it only where the CPU reports AVX-512F/BW/DQ/VL and the OS saves the
// zmm and mask registers (isa.h). A compiler that cannot target AVX-512 (not GCC >= 10 on
// x86-64) compiles only the stubs at the bottom, and compiled() says so.
#include <cmath>
#include <cstdint>

#include "../common/mask.h"
#include "../common/seqlen.h"
#include "convert.h"
#include "cpu_util.h"
#include "isa.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 10
#include <immintrin.h>
// Everything below, and only that (the standard headers above are not retargeted), may use
// AVX-512: it lives in its own namespace, so no inline function is shared with the other builds.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
// GCC 12's AVX-512 intrinsics (_mm512_undefined_*: `__m512 __Y = __Y;`) trip -Wall's
// maybe-uninitialized warning (GCC PR 105593); a false positive, silenced for this build.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define FLASHATTN_CPU_AVX2 1
#define FLASHATTN_CPU_AVX512 1
// The GEMM register tile (gemm.h): kMR rows x kNV 16-float vectors of accumulators. Measured
// on Zen 5 (AMD EPYC, 1 thread, the five tile GEMMs of the forward and backward at d = 64,
// best of 300): 4 x 4 and 5 x 4 ~233 GFLOP/s mean, 8 x 2 ~225, 6 x 4 / 12 x 2 / 14 x 2 ~220,
// 7 x 4 and 10 x 2 ~210; 4 x 4 also divides every tile height (64, 128, 256): no row tail.
#ifndef FLASHATTN_CPU_AVX512_MR
#define FLASHATTN_CPU_AVX512_MR 4
#endif
#ifndef FLASHATTN_CPU_AVX512_NV
#define FLASHATTN_CPU_AVX512_NV 4
#endif

namespace flashattn::cpu::avx512_impl {
#include "vec.h"
#include "gemm.h"
#include "scores.h"
#include "attn_fwd.h"
#include "attn_bwd.h"
#include "kernels_entry.h"
}  // namespace flashattn::cpu::avx512_impl

namespace flashattn::cpu::avx512 {
bool compiled() { return true; }
void fwd(const FwdParams& p, const ParallelFor& pf) { avx512_impl::run_fwd(p, pf); }
void bwd(const BwdParams& p, const ParallelFor& pf) { avx512_impl::run_bwd(p, pf); }
}  // namespace flashattn::cpu::avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options

#else
namespace flashattn::cpu::avx512 {
bool compiled() { return false; }
void fwd(const FwdParams& p, const ParallelFor& pf) { generic::fwd(p, pf); }
void bwd(const BwdParams& p, const ParallelFor& pf) { generic::bwd(p, pf); }
}  // namespace flashattn::cpu::avx512
#endif
