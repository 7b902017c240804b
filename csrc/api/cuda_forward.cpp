// The split build's side of the CUDA entry points in flashattn._C (setup.py,
// FLASHATTN_SPLIT_CUDA=1, also the macro): the
// functions of sm80_backend.h / sm90_backend.h defined here as calls through the CudaTable
// that flashattn._C_cuda hands over (common/cuda_table.h; flashattn/__init__.py calls
// `_C._set_cuda_table` at import when torch has CUDA). Until then, or where that library could
// not load, a CUDA call raises an error with the reason. Empty in one-library builds, whose
// kernels define these functions themselves.
#ifdef FLASHATTN_SPLIT_CUDA
#include <Python.h>

#include <string>

#include "../common/cuda_table.h"
#include "checks.h"
#include "cuda_forward.h"

namespace flashattn {
namespace {

const CudaTable* g_table = nullptr;
std::string g_missing = "flashattn/__init__.py has not loaded it yet";

const CudaTable& table() {
  if (g_table == nullptr)
    api::fail("this call runs CUDA kernels, which are in the library flashattn._C_cuda, and "
              "that library is not loaded: ", g_missing);
  return *g_table;
}

// The member, or an error naming what this build left out.
template <typename Fn>
Fn member(Fn CudaTable::*m, const char* what) {
  const Fn f = table().*m;
  if (f == nullptr) api::fail("flashattn._C_cuda of this build has no ", what);
  return f;
}

}  // namespace

namespace sm80 {
DeviceFit device_fit(int& cc) {
  return member(&CudaTable::sm80_device_fit, "sm80 kernels")(cc);
}
std::string built_targets() {
  return member(&CudaTable::sm80_built_targets, "sm80 kernels")();
}
void run_fwd(const FwdParams& p, void* s) {
  member(&CudaTable::sm80_run_fwd, "sm80 kernels")(p, s);
}
void run_kvcache_append(const FwdParams& p, const KvAppendParams& a, void* s) {
  member(&CudaTable::sm80_run_kvcache_append, "sm80 kernels")(p, a, s);
}
WorkspaceSizes fwd_kvcache_workspace(const FwdParams& p) {
  return member(&CudaTable::sm80_fwd_kvcache_workspace, "sm80 kernels")(p);
}
void run_fwd_kvcache(const FwdParams& p, void* s) {
  member(&CudaTable::sm80_run_fwd_kvcache, "sm80 kernels")(p, s);
}
void run_attn_probs(const FwdParams& p, void* s) {
  member(&CudaTable::sm80_run_attn_probs, "sm80 kernels")(p, s);
}
BwdWorkspaceSizes bwd_workspace(const BwdParams& p) {
  return member(&CudaTable::sm80_bwd_workspace, "sm80 backward kernels")(p);
}
void run_bwd(const BwdParams& p, void* s) {
  member(&CudaTable::sm80_run_bwd, "sm80 backward kernels")(p, s);
}
}  // namespace sm80

namespace sm90 {
const char* fwd_unsupported_here(const FwdParams& p) {
  return member(&CudaTable::sm90_fwd_unsupported_here, "sm90 kernels")(p);
}
WorkspaceSizes fwd_workspace(const FwdParams& p) {
  return member(&CudaTable::sm90_fwd_workspace, "sm90 kernels")(p);
}
void run_fwd(const FwdParams& p, void* s) {
  member(&CudaTable::sm90_run_fwd, "sm90 kernels")(p, s);
}
const char* bwd_unsupported_here(const BwdParams& p) {
  return member(&CudaTable::sm90_bwd_unsupported_here, "sm90 backward kernels")(p);
}
WorkspaceSizes bwd_workspace(const BwdParams& p) {
  return member(&CudaTable::sm90_bwd_workspace, "sm90 backward kernels")(p);
}
void run_bwd(const BwdParams& p, void* s) {
  member(&CudaTable::sm90_run_bwd, "sm90 backward kernels")(p, s);
}
}  // namespace sm90

namespace api {
void* cuda_current_stream(int32_t device_index) {
  void* stream = nullptr;
  FLASHATTN_CHECK(member(&CudaTable::current_stream, "stream query")(device_index, &stream) == 0,
                  "could not get the current CUDA stream");
  return stream;
}
}  // namespace api

// `_C._set_cuda_table(address, reason)` (module.cpp): address 0 records why the library did
// not load (reason); else the table, refused if it is of another version or size.
PyObject* set_cuda_table(PyObject*, PyObject* args) {
  PyObject* address = nullptr;
  const char* reason = nullptr;
  if (!PyArg_ParseTuple(args, "Oz", &address, &reason)) return nullptr;
  void* ptr = PyLong_AsVoidPtr(address);
  if (ptr == nullptr && PyErr_Occurred()) return nullptr;
  if (ptr == nullptr) {
    g_table = nullptr;
    g_missing = reason != nullptr ? reason : "unknown reason";
    Py_RETURN_NONE;
  }
  const auto* t = static_cast<const CudaTable*>(ptr);
  if (t->version != kCudaTableVersion || t->size != sizeof(CudaTable)) {
    PyErr_Format(PyExc_ImportError,
                 "flashattn._C_cuda is of another build than flashattn._C (its table version "
                 "%u, size %u; this one expects %u, %u): reinstall flashattn",
                 t->version, t->size, kCudaTableVersion, unsigned(sizeof(CudaTable)));
    return nullptr;
  }
  g_table = t;
  Py_RETURN_NONE;
}

}  // namespace flashattn
#endif  // FLASHATTN_SPLIT_CUDA
