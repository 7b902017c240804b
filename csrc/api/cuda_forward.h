// The split build's hooks in flashattn._C (cuda_forward.cpp; FLASHATTN_SPLIT_CUDA only).
#pragma once
#ifdef FLASHATTN_SPLIT_CUDA
#include <Python.h>

#include <cstdint>

namespace flashattn {
namespace api {
void* cuda_current_stream(int32_t device_index);  // through the table (torch's C shim)
}  // namespace api
PyObject* set_cuda_table(PyObject* self, PyObject* args);  // _C._set_cuda_table(address, reason)
}  // namespace flashattn
#endif
