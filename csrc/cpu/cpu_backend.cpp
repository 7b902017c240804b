// The CPU backend's entry points: picks the instruction-set build at run time.
#include "cpu_backend.h"

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include "cpu_util.h"
#include "isa.h"

namespace flashattn::cpu {
namespace {

enum class Isa { kGeneric, kAvx2, kAvx512 };

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
// Whether the OS saves (XCR0) the state a build's registers need: SSE + AVX (bits 1, 2) for
// AVX2; also the opmask and both halves of the zmm registers (bits 5, 6, 7) for AVX-512.
bool os_saves(uint32_t mask) {
  uint32_t eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_OSXSAVE)) return false;
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & mask) == mask;
}
#endif

// Whether this build has the ISA's kernels and this CPU (and OS) can run them; if not, why.
const char* isa_unavailable(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return nullptr;
    case Isa::kAvx2:
      if (!avx2::compiled()) return "this build has no AVX2 kernels (not x86-64 GCC)";
      break;
    case Isa::kAvx512:
      if (!avx512::compiled()) return "this build has no AVX-512 kernels (not x86-64 GCC >= 10)";
      break;
  }
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  __builtin_cpu_init();
  if (isa == Isa::kAvx2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("f16c") && os_saves(0x6)
               ? nullptr
               : "this CPU lacks AVX2, FMA or F16C";
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
                 os_saves(0xe6)
             ? nullptr
             : "this CPU (or its OS) lacks AVX-512F/BW/DQ/VL";
#else
  return "not an x86 CPU";
#endif
}

// The best build this CPU runs; FLASHATTN_CPU_ISA=generic|avx2|avx512 forces one (an error,
// not a fallback, where it cannot run here), unset or auto picks.
Isa pick_isa() {
  const char* env = std::getenv("FLASHATTN_CPU_ISA");
  const std::string want = env ? env : "";
  if (want.empty() || want == "auto") {
    if (!isa_unavailable(Isa::kAvx512)) return Isa::kAvx512;
    if (!isa_unavailable(Isa::kAvx2)) return Isa::kAvx2;
    return Isa::kGeneric;
  }
  Isa isa;
  if (want == "generic") {
    isa = Isa::kGeneric;
  } else if (want == "avx2") {
    isa = Isa::kAvx2;
  } else if (want == "avx512") {
    isa = Isa::kAvx512;
  } else {
    throw std::runtime_error("flashattn: FLASHATTN_CPU_ISA=" + want +
                             " is not one of auto, generic, avx2, avx512");
  }
  if (const char* why = isa_unavailable(isa))
    throw std::runtime_error("flashattn: FLASHATTN_CPU_ISA=" + want + " cannot run here: " + why);
  return isa;
}

// Chosen once per process (a forced ISA that cannot run raises on every call instead).
Isa cpu_isa() {
  static const Isa isa = pick_isa();
  return isa;
}

}  // namespace

void run_fwd(const FwdParams& params, const ParallelFor& parallel_for) {
  switch (cpu_isa()) {
    case Isa::kAvx512: return avx512::fwd(params, parallel_for);
    case Isa::kAvx2: return avx2::fwd(params, parallel_for);
    case Isa::kGeneric: return generic::fwd(params, parallel_for);
  }
}

BwdWorkspaceSizes bwd_workspace(const BwdParams& params) {
  BwdWorkspaceSizes ws;
  ws.f32_elems = int64_t(bwd_num_splits(params)) * params.total_q * params.nheads *
                 round_up(params.headdim, kColPad);
  return ws;
}

void run_bwd(const BwdParams& params, const ParallelFor& parallel_for) {
  switch (cpu_isa()) {
    case Isa::kAvx512: return avx512::bwd(params, parallel_for);
    case Isa::kAvx2: return avx2::bwd(params, parallel_for);
    case Isa::kGeneric: return generic::bwd(params, parallel_for);
  }
}

void run_probs(const FwdParams& params, const ParallelFor& parallel_for) {
  generic::probs(params, parallel_for);
}

}  // namespace flashattn::cpu
