// dopt::Error subclasses as Python exceptions. dopt.Error derives from
// RuntimeError (what torch raises for most failures); the subclasses that
// have a torch/Python counterpart also derive from it, so `except ValueError`
// catches dopt.ValueError as it catches torch's.
#include "convert.hpp"

#include "dopt/runtime/error.hpp"

namespace dopt::python {
namespace {

struct Classes {
  PyObject* error = nullptr;
  PyObject* value = nullptr;
  PyObject* type = nullptr;
  PyObject* key = nullptr;
  PyObject* shape = nullptr;
  PyObject* dtype = nullptr;
  PyObject* device = nullptr;
  PyObject* state = nullptr;
  PyObject* state_dict = nullptr;
  PyObject* io = nullptr;
  PyObject* not_supported = nullptr;
  PyObject* timeout = nullptr;
  PyObject* mismatch = nullptr;
  PyObject* peer_lost = nullptr;
};

Classes& classes() {
  static Classes c;  // leaked on purpose: the module owns references to the classes
  return c;
}

PyObject* make(py::module_& m, const char* name, std::initializer_list<PyObject*> bases, const char* doc) {
  py::tuple b(bases.size());
  std::size_t i = 0;
  for (PyObject* base : bases) b[i++] = py::reinterpret_borrow<py::object>(base);
  const std::string full = std::string("dopt.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), doc, b.ptr(), nullptr);
  if (!cls) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;
}

}  // namespace

void register_errors(py::module_& m) {
  Classes& c = classes();
  c.error = make(m, "Error", {PyExc_RuntimeError}, "Base class of dopt's errors (a RuntimeError).");
  c.value = make(m, "ValueError", {c.error, PyExc_ValueError}, "A bad argument value.");
  c.type = make(m, "TypeError", {c.error, PyExc_TypeError}, "An argument of the wrong kind.");
  c.key = make(m, "KeyError", {c.error, PyExc_KeyError}, "A missing key in a name-indexed lookup.");
  c.shape = make(m, "ShapeError", {c.value}, "Tensor shapes that do not fit together.");
  c.dtype = make(m, "DTypeError", {c.value}, "Tensor dtypes that do not fit together.");
  c.device = make(m, "DeviceError", {c.value}, "A tensor on a device the operation does not support.");
  c.state = make(m, "StateError", {c.error}, "A call made in the wrong state.");
  c.state_dict = make(m, "StateDictError", {c.value}, "A state dict that does not match the optimizer.");
  c.io = make(m, "IOError", {c.error}, "Reading or writing a file failed.");
  c.not_supported = make(m, "NotSupportedError", {c.error, PyExc_NotImplementedError},
                         "A feature this build or this package does not have.");
  c.timeout = make(m, "TimeoutError", {c.error}, "A distributed operation did not finish in time.");
  c.mismatch = make(m, "CollectiveMismatchError", {c.error}, "Ranks called different collectives.");
  c.peer_lost = make(m, "PeerLostError", {c.error}, "A peer process died or was cut off.");

  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    const Classes& k = classes();
    try {
      std::rethrow_exception(p);
    } catch (const ShapeError& e) {
      PyErr_SetString(k.shape, e.what());
    } catch (const DTypeError& e) {
      PyErr_SetString(k.dtype, e.what());
    } catch (const DeviceError& e) {
      PyErr_SetString(k.device, e.what());
    } catch (const StateDictError& e) {
      PyErr_SetString(k.state_dict, e.what());
    } catch (const ValueError& e) {
      PyErr_SetString(k.value, e.what());
    } catch (const TypeError& e) {
      PyErr_SetString(k.type, e.what());
    } catch (const KeyError& e) {
      PyErr_SetString(k.key, e.what());
    } catch (const StateError& e) {
      PyErr_SetString(k.state, e.what());
    } catch (const IOError& e) {
      PyErr_SetString(k.io, e.what());
    } catch (const NotSupportedError& e) {
      PyErr_SetString(k.not_supported, e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(k.timeout, e.what());
    } catch (const CollectiveMismatchError& e) {
      PyErr_SetString(k.mismatch, e.what());
    } catch (const PeerLostError& e) {
      PyErr_SetString(k.peer_lost, e.what());
    } catch (const Error& e) {
      PyErr_SetString(k.error, e.what());
    }
  });
}

}  // namespace dopt::python
