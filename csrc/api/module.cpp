// The Python module stub: `import flashattn._C` loads this library, whose static
// initialisers register the ops (flash_api.cpp). Python's limited API only. The split build
// (FLASHATTN_SPLIT_CUDA) adds `_set_cuda_table`, through which flashattn/__init__.py hands
// over the kernels of flashattn._C_cuda (cuda_forward.cpp).
#include <Python.h>

#include "cuda_forward.h"

static PyMethodDef flashattn_methods[] = {
#ifdef FLASHATTN_SPLIT_CUDA
    {"_set_cuda_table", flashattn::set_cuda_table, METH_VARARGS,
     "_set_cuda_table(address, reason): the CUDA kernels' table from flashattn._C_cuda, or "
     "address 0 and why that library did not load."},
#endif
    {nullptr, nullptr, 0, nullptr}};

static PyModuleDef flashattn_module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1,
                                       flashattn_methods, nullptr, nullptr, nullptr, nullptr};

extern "C" PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&flashattn_module); }
