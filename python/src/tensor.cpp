// dopt.Tensor in Python: an opaque handle to a dopt::Tensor, made from and
// turned into torch tensors through DLPack without copying.
#include "convert.hpp"

namespace dopt::python {

void bind_tensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor", "A dopt tensor handle (shares memory with the torch tensor it came from).")
      .def("to_dlpack", [](const Tensor& t) { return to_capsule(t); },
           "A DLPack capsule over this tensor's memory (for torch.utils.dlpack.from_dlpack).")
      .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()); })
      .def_property_readonly("shape", [](const Tensor& t) { return t.shape(); })
      .def_property_readonly("numel", &Tensor::numel)
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property("requires_grad", &Tensor::requires_grad,
                    [](const Tensor& t, bool v) { t.set_requires_grad(v); })
      .def_property_readonly("grad",
                             [](const Tensor& t) -> py::object {
                               Tensor g = t.grad();
                               return g.defined() ? py::cast(g) : py::none();
                             })
      .def("set_grad",
           [](const Tensor& t, const py::object& g) { t.set_grad(g.is_none() ? Tensor() : g.cast<Tensor>()); },
           py::arg("grad").none(true))
      .def("set_data", [](const Tensor& t, const Tensor& other) { t.set_data(other); },
           "Re-points this tensor object at other's memory (every handle follows).")
      .def_property_readonly("key", [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.key()); },
                             "Identity of the tensor object (stable while it lives).")
      .def("is_same", &Tensor::is_same)
      .def("equal", &Tensor::equal)
      .def("shares_storage_with", &Tensor::shares_storage_with)
      .def("__repr__", &Tensor::str);

  m.def("from_dlpack", &from_capsule, py::arg("capsule"), py::arg("requires_grad") = true,
        "A dopt tensor over the memory of a DLPack capsule (torch.utils.dlpack.to_dlpack), no copy.");
  m.def(
      "from_dlpack_many",
      [](const py::list& capsules, const py::list& requires_grad) {
        std::vector<Tensor> out;
        out.reserve(capsules.size());
        for (std::size_t i = 0; i < capsules.size(); ++i)
          out.push_back(from_capsule(capsules[i].cast<py::capsule>(), requires_grad[i].cast<bool>()));
        return out;
      },
      "from_dlpack over lists.");
}

}  // namespace dopt::python
