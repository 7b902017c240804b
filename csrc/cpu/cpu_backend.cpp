// The CPU backend's entry points: picks the instruction-set build at run time.
#include "cpu_backend.h"

#include <cstdlib>
#include <cstring>

#include "cpu_util.h"
#include "isa.h"

namespace flashattn::cpu {
namespace {

// AVX2 + FMA + F16C where the CPU has them; FLASHATTN_CPU_ISA=generic forces the portable build.
bool use_avx2() {
  static const bool use = [] {
    const char* env = std::getenv("FLASHATTN_CPU_ISA");
    if (env && std::strcmp(env, "generic") == 0) return false;
    if (!avx2::compiled()) return false;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return false;
#endif
  }();
  return use;
}

}  // namespace

void run_fwd(const FwdParams& params, const ParallelFor& parallel_for) {
  if (use_avx2()) return avx2::fwd(params, parallel_for);
  generic::fwd(params, parallel_for);
}

BwdWorkspaceSizes bwd_workspace(const BwdParams& params) {
  BwdWorkspaceSizes ws;
  ws.f32_elems = int64_t(bwd_num_splits(params)) * params.total_q * params.nheads *
                 round_up(params.headdim, kColPad);
  return ws;
}

void run_bwd(const BwdParams& params, const ParallelFor& parallel_for) {
  if (use_avx2()) return avx2::bwd(params, parallel_for);
  generic::bwd(params, parallel_for);
}

void run_probs(const FwdParams& params, const ParallelFor& parallel_for) {
  generic::probs(params, parallel_for);
}

}  // namespace flashattn::cpu
