// Per-instruction-set entry points: the dtype switch. Included last, inside namespace
// flashattn::cpu::FLASHATTN_CPU_ISA, by each kernels_*.cpp.

inline void run_fwd(const FwdParams& p, const ParallelFor& parallel_for) {
  switch (p.dtype) {
    case DType::kFloat32: return FwdKernel<DType::kFloat32>::run(p, parallel_for);
    case DType::kFloat16: return FwdKernel<DType::kFloat16>::run(p, parallel_for);
    case DType::kBFloat16: return FwdKernel<DType::kBFloat16>::run(p, parallel_for);
    case DType::kFloat8E4M3:  // out bf16 or fp16 (params.h); a build without FP8 refuses it
#ifndef FLASHATTN_DISABLE_FP8
      if (p.out_dtype == DType::kFloat16)
        return FwdKernel<DType::kFloat8E4M3, DType::kFloat16>::run(p, parallel_for);
      return FwdKernel<DType::kFloat8E4M3, DType::kBFloat16>::run(p, parallel_for);
#else
      return;  // refused by the API (input_checks.h, check_dtypes)
#endif
  }
}

inline void run_bwd(const BwdParams& p, const ParallelFor& parallel_for) {
  switch (p.dtype) {
    case DType::kFloat32: return BwdKernel<DType::kFloat32>::run(p, parallel_for);
    case DType::kFloat16: return BwdKernel<DType::kFloat16>::run(p, parallel_for);
    case DType::kBFloat16: return BwdKernel<DType::kBFloat16>::run(p, parallel_for);
    case DType::kFloat8E4M3: return;  // forward only: the API refuses it (kFp8ForwardOnly)
  }
}
