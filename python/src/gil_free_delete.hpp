#pragma once
// A pybind11 holder deleter that destroys the object without the GIL.
//
// Destroying a process group (or an object that holds one) joins the group's
// threads. One of them may be releasing a torch tensor it took by DLPack, and
// torch's tensor destructor takes the GIL: had the Python thread that runs the
// dealloc kept the GIL, both would wait for ever.
#include <memory>

#include <pybind11/pybind11.h>

namespace dopt::python {

template <class T>
struct GilFreeDelete {
  void operator()(T* p) const {
    if (p == nullptr) return;
    if (Py_IsInitialized() && PyGILState_Check()) {
      pybind11::gil_scoped_release release;
      delete p;
    } else {
      delete p;
    }
  }
};

/// The holder of a bound class whose destructor may wait for dopt's threads.
template <class T>
using GilFreeHolder = std::unique_ptr<T, GilFreeDelete<T>>;

}  // namespace dopt::python
