// dopt._C: the compiled part of the Python package `dopt` (see python/dopt).
#include "convert.hpp"

namespace dopt::python {
void bind_checkpointer(py::module_& m);  // checkpointer.cpp
void bind_zero3(py::module_& m);         // zero3.cpp
}  // namespace dopt::python

PYBIND11_MODULE(_C, m) {
  using namespace dopt::python;
  m.doc() = "dopt's C++ core for the Python package (use the `dopt` package, not this module)";
  register_errors(m);
  bind_tensor(m);
  bind_distributed(m);
  bind_optim(m);
  bind_zero(m);
  bind_zero3(m);
  bind_rpc(m);
  bind_checkpointer(m);
}
