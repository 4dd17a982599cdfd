// `import fusedops._C` loads this library; its static initializers register the operators.
// Only the Python build compiles this file: the CMake library is loaded by torch.ops.load_library.
#include <Python.h>

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
