// Input checks for the ops: every failure names the argument and what was expected.
#pragma once
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace flashattn::api {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  os << "flashattn: ";
  (os << ... << args);
  throw std::runtime_error(os.str());
}

#define FLASHATTN_CHECK(cond, ...) \
  do {                             \
    if (!(cond)) ::flashattn::api::fail(__VA_ARGS__); \
  } while (0)

// FP8 (issue 14): the errors of a backward through float8 inputs (the ops and flashattn/ops.py's
// autograd raise the same words) and of a build without FP8.
inline constexpr const char* kFp8ForwardOnly =
    "FP8 attention is forward only (issue 14): float8_e4m3fn q, k, v have no backward (call "
    "the forward under torch.no_grad(), or on tensors that do not require grad)";
inline constexpr const char* kFp8Disabled =
    "FP8 attention (float8_e4m3fn q, k, v) is disabled in this build (FLASHATTN_DISABLE_FP8=1): "
    "this build has no FP8 kernels";

inline const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Short: return "int16";
    case ScalarType::Char: return "int8";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Bool: return "bool";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case ScalarType::Float8_e8m0fnu: return "float8_e8m0fnu";
    default: return "an unsupported dtype";
  }
}

inline std::string shape_str(const Tensor& t) {
  std::ostringstream os;
  os << "(";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << ")";
  return os.str();
}

inline std::string device_str(const Tensor& t) {
  return t.is_cuda() ? "cuda:" + std::to_string(t.get_device_index()) : "cpu";
}

inline void check_dim(const Tensor& t, const char* name, int64_t dim, const char* layout) {
  FLASHATTN_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions ", layout, ", got shape ",
                  shape_str(t));
}

inline void check_same_device(const Tensor& t, const char* name, const Tensor& q) {
  FLASHATTN_CHECK(t.is_cuda() == q.is_cuda() &&
                      (!t.is_cuda() || t.get_device_index() == q.get_device_index()),
                  name, " must be on the same device as q (", device_str(q), "), got ",
                  device_str(t));
}

inline void check_last_contiguous(const Tensor& t, const char* name) {
  FLASHATTN_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, name,
                  " must have a contiguous last dimension (stride 1), got stride ", t.stride(-1));
}

inline void check_size(const Tensor& t, const char* name, int64_t dim, int64_t expected,
                       const char* what) {
  FLASHATTN_CHECK(t.size(dim) == expected, name, " has ", what, " ", t.size(dim), " but ",
                  expected, " was expected (shape ", shape_str(t), ")");
}

}  // namespace flashattn::api
