// The Python module stub: `import flashattn._C` loads this library, whose static
// initialisers register the ops (flash_api.cpp). Python's limited API only.
#include <Python.h>

static PyModuleDef flashattn_module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr,
                                       nullptr, nullptr, nullptr, nullptr};

extern "C" PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&flashattn_module); }
