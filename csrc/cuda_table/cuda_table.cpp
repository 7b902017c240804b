// flashattn._C_cuda, the split build's CUDA library (setup.py, FLASHATTN_SPLIT_CUDA=1): the
// sm80 / sm90 kernel families linked with torch's CUDA libraries, and this file, which hands
// their entry points to flashattn._C as a CudaTable (common/cuda_table.h). Python's limited
// API only: `_C_cuda._table()` returns the table's address, which flashattn/__init__.py passes
// to `_C._set_cuda_table`.
#include <Python.h>

#include "../common/cuda_table.h"

extern "C" {
// torch's C shim (libtorch_cuda), declared here as flash_api.cpp declares it in one-library
// builds.
int32_t aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);
}

namespace {

flashattn::CudaTable make_table() {
  flashattn::CudaTable t{};
  t.version = flashattn::kCudaTableVersion;
  t.size = sizeof(flashattn::CudaTable);
#ifndef FLASHATTN_DISABLE_SM80
  t.sm80_device_fit = &flashattn::sm80::device_fit;
  t.sm80_built_targets = &flashattn::sm80::built_targets;
  t.sm80_run_fwd = &flashattn::sm80::run_fwd;
  t.sm80_run_kvcache_append = &flashattn::sm80::run_kvcache_append;
  t.sm80_fwd_kvcache_workspace = &flashattn::sm80::fwd_kvcache_workspace;
  t.sm80_run_fwd_kvcache = &flashattn::sm80::run_fwd_kvcache;
  t.sm80_run_attn_probs = &flashattn::sm80::run_attn_probs;
#ifndef FLASHATTN_DISABLE_BACKWARD
  t.sm80_bwd_workspace = &flashattn::sm80::bwd_workspace;
  t.sm80_run_bwd = &flashattn::sm80::run_bwd;
#endif
#endif
#ifndef FLASHATTN_DISABLE_SM90
  t.sm90_fwd_unsupported_here = &flashattn::sm90::fwd_unsupported_here;
  t.sm90_fwd_workspace = &flashattn::sm90::fwd_workspace;
  t.sm90_run_fwd = &flashattn::sm90::run_fwd;
#ifndef FLASHATTN_DISABLE_BACKWARD
  t.sm90_bwd_unsupported_here = &flashattn::sm90::bwd_unsupported_here;
  t.sm90_bwd_workspace = &flashattn::sm90::bwd_workspace;
  t.sm90_run_bwd = &flashattn::sm90::run_bwd;
#endif
#endif
  t.current_stream = &aoti_torch_get_current_cuda_stream;
  return t;
}

const flashattn::CudaTable kTable = make_table();

PyObject* table(PyObject*, PyObject*) {
  return PyLong_FromVoidPtr(const_cast<flashattn::CudaTable*>(&kTable));
}

PyMethodDef methods[] = {
    {"_table", table, METH_NOARGS, "The address of the kernels' CudaTable (for flashattn._C)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef cuda_module = {PyModuleDef_HEAD_INIT, "_C_cuda", nullptr, -1, methods,
                           nullptr, nullptr, nullptr, nullptr};

}  // namespace

extern "C" PyMODINIT_FUNC PyInit__C_cuda(void) { return PyModule_Create(&cuda_module); }
