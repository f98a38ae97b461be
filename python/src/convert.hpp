#pragma once
// Conversions between Python objects and dopt values for the _C extension:
// tensors (DLPack capsules, zero-copy), hyperparameters, state dicts, and the
// mapping of dopt::Error subclasses to Python exceptions.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dopt/runtime/hyperparams.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::python {

namespace py = pybind11;

/// A DLPack capsule ("dltensor") sharing t's memory; t's storage stays alive
/// until the consumer (torch.utils.dlpack.from_dlpack) releases it.
py::capsule to_capsule(const Tensor& t);
/// Consumes a "dltensor" capsule (renamed "used_dltensor") without a copy.
/// The producer's tensor stays alive as long as the dopt tensor lives.
Tensor from_capsule(const py::capsule& capsule, bool requires_grad);

/// Python dict -> Hyperparams: bool, int/float (as double), str, and tuples or
/// lists of numbers; None values are left out. Anything else is a TypeError
/// naming `op` and the key.
Hyperparams hyper_from_py(const py::dict& d, const char* op);
py::dict hyper_to_py(const Hyperparams& h);

/// StateDict <-> {"state": {int: {str: Tensor}}, "param_groups": [{..., "params": [int]}],
/// "metadata": {str: str}} with dopt tensors (the Python side converts them).
py::dict state_dict_to_py(const StateDict& sd);
StateDict state_dict_from_py(const py::dict& d, const char* op);

/// Parameter groups from [(list of Tensor, dict of hyperparameters or None), ...].
using PyGroups = std::vector<std::pair<std::vector<Tensor>, py::object>>;

/// A Python callable kept in C++ (e.g. inside std::function): the GIL is
/// taken for the call and for the final release, whichever thread does them.
class PyCallback {
 public:
  explicit PyCallback(py::object f);
  template <class... A>
  py::object operator()(A&&... args) const {
    py::gil_scoped_acquire gil;
    return (*f_)(std::forward<A>(args)...);
  }

 private:
  std::shared_ptr<py::object> f_;
};

/// Registers the Python exception classes (dopt.Error and its subclasses)
/// and the translator from dopt::Error.
void register_errors(py::module_& m);

void bind_tensor(py::module_& m);
void bind_distributed(py::module_& m);
void bind_optim(py::module_& m);
void bind_zero(py::module_& m);
void bind_rpc(py::module_& m);

}  // namespace dopt::python
