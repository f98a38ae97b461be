// dopt._storage: points a torch tensor's storage at memory dopt owns, or at
// nothing, so that dopt.fully_shard's parameters (views of the unit's flat
// tensor) live in ShardedUnits' gathered memory instead of a copy of it, as
// libtorch's FullyShard does (libtorch/src/fully_shard.cpp). Built when
// find_package(Torch) finds the libtorch the interpreter's torch is made of
// (Debian's python3-torch and libtorch-dev); fully_shard falls back to the
// copy without it. Links c10 only; no GIL release (nothing waits).
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

namespace {

/// tensor_impl: a CPU tensor's `_cdata` (its TensorImpl); data: the first
/// byte of `nbytes` bytes that the caller keeps alive until it points the
/// storage elsewhere (0 and 0: at nothing). Views of the tensor follow (they
/// share the storage); nothing is freed when the storage lets go of `data`.
void point(std::uintptr_t tensor_impl, std::uintptr_t data, std::size_t nbytes) {
  auto* t = reinterpret_cast<c10::TensorImpl*>(tensor_impl);
  if (t == nullptr || !t->has_storage() || t->device().type() != c10::DeviceType::CPU)
    throw pybind11::value_error("dopt._storage.point: not a CPU tensor with a storage");
  if ((data == 0) != (nbytes == 0)) throw pybind11::value_error("dopt._storage.point: data and nbytes disagree");
  c10::StorageImpl* s = t->storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(reinterpret_cast<void*>(data), c10::Device(c10::DeviceType::CPU)));
  s->set_nbytes(nbytes);
}

}  // namespace

PYBIND11_MODULE(_storage, m) {
  m.doc() = "dopt.fully_shard's storage pointing (internal)";
  m.def("point", &point, pybind11::arg("tensor_impl"), pybind11::arg("data"), pybind11::arg("nbytes"));
}
