// The instruction-set builds of the CPU kernels (kernels_*.cpp) and the run-time choice
// between them (cpu_backend.cpp).
#pragma once
#include "cpu_backend.h"

namespace flashattn::cpu {

namespace avx2 {
bool compiled();  // false where the AVX2 build is not compiled (non-x86 or non-GCC)
void fwd(const FwdParams& p, const ParallelFor& parallel_for);
void bwd(const BwdParams& p, const ParallelFor& parallel_for);
}  // namespace avx2

// 16-lane build (kernels_avx512.cpp): run only where cpu_backend.cpp's check passes.
namespace avx512 {
bool compiled();  // false where the AVX-512 build is not compiled (non-x86, not GCC >= 10)
void fwd(const FwdParams& p, const ParallelFor& parallel_for);
void bwd(const BwdParams& p, const ParallelFor& parallel_for);
}  // namespace avx512

namespace generic {
void fwd(const FwdParams& p, const ParallelFor& parallel_for);
void bwd(const BwdParams& p, const ParallelFor& parallel_for);
void probs(const FwdParams& p, const ParallelFor& parallel_for);  // attn_probs (params.h)
}  // namespace generic

}  // namespace flashattn::cpu
