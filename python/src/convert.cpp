#include "convert.hpp"

#include <dlpack/dlpack.h>

#include "dopt/runtime/error.hpp"

namespace dopt::python {
namespace {

constexpr const char* kCapsule = "dltensor";
constexpr const char* kUsedCapsule = "used_dltensor";

void capsule_destructor(PyObject* o) {
  // Only a capsule nobody consumed still owns its tensor.
  if (PyCapsule_IsValid(o, kCapsule)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(o, kCapsule));
    if (m && m->deleter) m->deleter(m);
  } else {
    PyErr_Clear();
  }
}

bool is_number(const py::handle& v) {
  return py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v);
}

}  // namespace

py::capsule to_capsule(const Tensor& t) {
  DLManagedTensor* m = t.to_dlpack();
  PyObject* c = PyCapsule_New(m, kCapsule, capsule_destructor);
  if (!c) {
    m->deleter(m);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(c);
}

Tensor from_capsule(const py::capsule& capsule, bool requires_grad) {
  PyObject* o = capsule.ptr();
  if (!PyCapsule_IsValid(o, kCapsule))
    throw TypeError("from_dlpack", "expected an unconsumed DLPack capsule named 'dltensor'");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(o, kCapsule));
  Tensor t = Tensor::from_dlpack(m);  // owns m from here on (calls its deleter)
  PyCapsule_SetName(o, kUsedCapsule);
  t.set_requires_grad(requires_grad);
  return t;
}

Hyperparams hyper_from_py(const py::dict& d, const char* op) {
  Hyperparams h;
  for (const auto& [k, v] : d) {
    const std::string key = py::str(k);
    if (v.is_none()) continue;
    if (py::isinstance<py::bool_>(v)) {
      h[key] = v.cast<bool>();
    } else if (is_number(v)) {
      h[key] = v.cast<double>();
    } else if (py::isinstance<py::str>(v)) {
      h[key] = v.cast<std::string>();
    } else if (py::isinstance<py::tuple>(v) || py::isinstance<py::list>(v)) {
      std::vector<double> xs;
      for (const auto& x : v) {
        if (!is_number(x) || py::isinstance<py::bool_>(x))
          throw TypeError(op, "hyperparameter '" + key + "' must be a number, a bool, a string or a tuple of numbers");
        xs.push_back(x.cast<double>());
      }
      h[key] = std::move(xs);
    } else if (py::hasattr(v, "item") && py::hasattr(v, "numel") && v.attr("numel")().cast<long>() == 1) {
      h[key] = v.attr("item")().cast<double>();  // a one-element tensor, e.g. a learning rate
    } else {
      throw TypeError(op, "hyperparameter '" + key + "' has an unsupported type " +
                              std::string(py::str(py::type::of(v).attr("__name__"))));
    }
  }
  return h;
}

py::dict hyper_to_py(const Hyperparams& h) {
  py::dict d;
  for (const auto& [k, v] : h) {
    if (const auto* b = std::get_if<bool>(&v)) d[py::str(k)] = py::bool_(*b);
    else if (const auto* x = std::get_if<double>(&v)) d[py::str(k)] = py::float_(*x);
    else if (const auto* xs = std::get_if<std::vector<double>>(&v)) d[py::str(k)] = py::tuple(py::cast(*xs));
    else d[py::str(k)] = py::str(std::get<std::string>(v));
  }
  return d;
}

py::dict state_dict_to_py(const StateDict& sd) {
  py::dict state;
  for (const auto& [idx, st] : sd.state) {
    py::dict entry;
    for (const auto& [k, t] : st)
      if (t.defined()) entry[py::str(k)] = py::cast(t);
    state[py::int_(idx)] = entry;
  }
  py::list groups;
  for (const auto& g : sd.param_groups) {
    py::dict gd = hyper_to_py(g.hyperparams);
    gd["params"] = py::cast(g.params);
    groups.append(gd);
  }
  py::dict meta;
  for (const auto& [k, v] : sd.metadata) meta[py::str(k)] = py::str(v);
  py::dict out;
  out["state"] = state;
  out["param_groups"] = groups;
  out["metadata"] = meta;
  return out;
}

StateDict state_dict_from_py(const py::dict& d, const char* op) {
  StateDict sd;
  if (!d.contains("state") || !d.contains("param_groups"))
    throw StateDictError(op, "a state dict needs the keys 'state' and 'param_groups'");
  for (const auto& [k, v] : d["state"].cast<py::dict>()) {
    ParamState st;
    for (const auto& [name, t] : v.cast<py::dict>()) {
      if (t.is_none()) continue;
      st[py::str(name)] = t.cast<Tensor>();
    }
    sd.state[k.cast<std::int64_t>()] = std::move(st);
  }
  for (const auto& g : d["param_groups"]) {
    py::dict gd = g.cast<py::dict>();
    if (!gd.contains("params")) throw StateDictError(op, "a parameter group has no 'params'");
    StateDict::Group group;
    group.params = gd["params"].cast<std::vector<std::int64_t>>();
    py::dict rest;
    for (const auto& [k, v] : gd)
      if (py::str(k).cast<std::string>() != "params") rest[k] = v;
    group.hyperparams = hyper_from_py(rest, op);
    sd.param_groups.push_back(std::move(group));
  }
  if (d.contains("metadata"))
    for (const auto& [k, v] : d["metadata"].cast<py::dict>()) sd.metadata[py::str(k)] = py::str(v);
  return sd;
}

PyCallback::PyCallback(py::object f)
    : f_(new py::object(std::move(f)), [](py::object* p) {
        py::gil_scoped_acquire gil;
        delete p;
      }) {}

}  // namespace dopt::python
