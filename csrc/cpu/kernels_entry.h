// Per-instruction-set entry points: the dtype switch. Included last, inside namespace
// flashattn::cpu::FLASHATTN_CPU_ISA, by each kernels_*.cpp.

inline void run_fwd(const FwdParams& p, const ParallelFor& parallel_for) {
  switch (p.dtype) {
    case DType::kFloat32: return FwdKernel<DType::kFloat32>::run(p, parallel_for);
    case DType::kFloat16: return FwdKernel<DType::kFloat16>::run(p, parallel_for);
    case DType::kBFloat16: return FwdKernel<DType::kBFloat16>::run(p, parallel_for);
  }
}

inline void run_bwd(const BwdParams& p, const ParallelFor& parallel_for) {
  switch (p.dtype) {
    case DType::kFloat32: return BwdKernel<DType::kFloat32>::run(p, parallel_for);
    case DType::kFloat16: return BwdKernel<DType::kFloat16>::run(p, parallel_for);
    case DType::kBFloat16: return BwdKernel<DType::kBFloat16>::run(p, parallel_for);
  }
}
