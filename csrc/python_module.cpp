// `import fusedops._C` loads this library: its static initializers register the operators, and
// the module adds a direct call of each functional forward (fusedops/functional.py).
// Only the Python build compiles this file: the CMake library is loaded by torch.ops.load_library.
//
// Why the direct calls: an OpOverload call from Python parses its arguments against the schema
// into a boxed stack (~2.9 µs of a tiny CPU softmax's 3.1; torch.softmax costs 2.3-2.6 in all).
// These convert the arguments straight to the op's C++ types and call the same op through the
// dispatcher, unboxed (~1.8 µs): autograd, autocast, profilers, tracers and __torch_dispatch__
// see the same op as before. Anything they don't take as it is (a Tensor subclass, a torch
// function mode, an argument of another Python type) returns NotImplemented, and the caller
// falls back to the OpOverload, which handles it or names the error. Under torch.compile the
// callers use the OpOverload, which dynamo traces.
#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <tuple>
#include <utility>

#include "autograd/forward_ops.h"

namespace fusedops {
namespace {

// Arg<T>::type holds a Python object converted to the op's parameter type T; from() says
// whether the object is exactly what the schema takes.
template <typename T>
struct Arg;

// A Tensor or Parameter, not a subclass (whose __torch_function__ the OpOverload runs).
template <>
struct Arg<const at::Tensor&> {
  using type = at::Tensor;
  static bool from(PyObject* o, type& out) {
    if (!THPVariable_CheckExact(o)) return false;
    out = THPVariable_Unpack(o);
    return true;
  }
};

template <>
struct Arg<int64_t> {
  using type = int64_t;
  static bool from(PyObject* o, type& out) {
    if (!PyLong_CheckExact(o)) return false;  // not a bool, which the schema's int refuses
    int overflow = 0;
    out = PyLong_AsLongLongAndOverflow(o, &overflow);
    return overflow == 0;
  }
};

template <>
struct Arg<bool> {
  using type = bool;
  static bool from(PyObject* o, type& out) {
    if (!PyBool_Check(o)) return false;
    out = o == Py_True;
    return true;
  }
};

template <>
struct Arg<double> {
  using type = double;
  static bool from(PyObject* o, type& out) {
    if (!PyFloat_CheckExact(o)) return false;
    out = PyFloat_AS_DOUBLE(o);
    return true;
  }
};

// None, or what Arg<T> takes.
template <typename T>
struct OptionalArg {
  using type = std::optional<typename Arg<T>::type>;
  static bool from(PyObject* o, type& out) {
    if (o == Py_None) return true;
    typename Arg<T>::type value;
    if (!Arg<T>::from(o, value)) return false;
    out = std::move(value);
    return true;
  }
};
template <>
struct Arg<const std::optional<at::Tensor>&> : OptionalArg<const at::Tensor&> {};
template <>
struct Arg<std::optional<double>> : OptionalArg<double> {};

// A tuple (torch.Size too) or list of Python ints.
template <>
struct Arg<at::IntArrayRef> {
  using type = c10::SmallVector<int64_t, 5>;
  static bool from(PyObject* o, type& out) {
    const bool tuple = PyTuple_Check(o);
    if (!tuple && !PyList_CheckExact(o)) return false;
    const Py_ssize_t n = tuple ? PyTuple_GET_SIZE(o) : PyList_GET_SIZE(o);
    out.resize(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!Arg<int64_t>::from(tuple ? PyTuple_GET_ITEM(o, i) : PyList_GET_ITEM(o, i), out[i])) {
        return false;
      }
    }
    return true;
  }
};

template <>
struct Arg<c10::string_view> {
  using type = c10::string_view;
  static bool from(PyObject* o, type& out) {
    if (!PyUnicode_CheckExact(o)) return false;
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(o, &size);
    if (data == nullptr) {
      PyErr_Clear();
      return false;
    }
    out = c10::string_view(data, size);
    return true;
  }
};

const at::Tensor& first(const at::Tensor& t) { return t; }
template <typename... Ts>
const at::Tensor& first(const std::tuple<at::Tensor, Ts...>& t) {
  return std::get<0>(t);
}

template <typename... Params, size_t... I>
bool convert(PyObject* const* args, std::tuple<typename Arg<Params>::type...>& values,
             std::index_sequence<I...>) {
  return (Arg<Params>::from(args[I], std::get<I>(values)) && ...);
}

template <auto op>
struct DirectCall;

// Calls `op` (one of autograd/forward_ops.h) with the Python arguments and returns its first
// output, what the functional returns; NotImplemented where an argument is not exactly of the
// op's parameter type.
template <typename Ret, typename... Params, Ret (*op)(Params...)>
struct DirectCall<op> {
  static PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    HANDLE_TH_ERRORS
    if (nargs != Py_ssize_t(sizeof...(Params)) || at::impl::torch_function_mode_enabled()) {
      Py_RETURN_NOTIMPLEMENTED;
    }
    std::tuple<typename Arg<Params>::type...> values;
    if (!convert<Params...>(args, values, std::index_sequence_for<Params...>{})) {
      Py_RETURN_NOTIMPLEMENTED;
    }
    at::Tensor out;
    {
      const pybind11::gil_scoped_release no_gil;
      out = first(std::apply(op, values));
    }
    return THPVariable_Wrap(std::move(out));
    END_HANDLE_TH_ERRORS
  }
};

template <auto op>
PyMethodDef direct(const char* name) {
  return {name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&DirectCall<op>::call)),
          METH_FASTCALL, nullptr};
}

PyMethodDef methods[] = {
    direct<&softmax_fwd_op>("softmax"),   direct<&layer_norm_fwd_op>("layer_norm"),
    direct<&rms_norm_fwd_op>("rms_norm"), direct<&bias_gelu_fwd_op>("bias_gelu"),
    direct<&mlp_fwd_op>("fused_mlp"),     {nullptr, nullptr, 0, nullptr},
};

}  // namespace
}  // namespace fusedops

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, fusedops::methods};
  return PyModule_Create(&module);
}
