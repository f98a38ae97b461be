// dopt::rpc and DistributedOptimizer for the Python package. Python
// functions travel by name (module, qualified name) with pickled arguments
// and results, as torch's RPC pickles them; the callee runs them on its RPC
// pool with the GIL taken. Tensors a remote call keeps (remote(), RRef(t))
// are dopt tensors sharing the torch tensor's memory.
#include <chrono>
#include <optional>
#include <string>

#include "convert.hpp"
#include "gil_free_delete.hpp"
#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "runtime_holder.hpp"

namespace dopt::python {
namespace {

constexpr const char* kCall = "dopt.python.call";
constexpr const char* kRemoteTensor = "dopt.python.remote_tensor";

/// Runs `fn` of the dopt.rpc Python module with the GIL; a Python exception
/// becomes the dopt::Error subclass of its kind, so the caller sees it.
template <class F>
auto with_python(const std::string& what, F&& fn) {
  py::gil_scoped_acquire gil;
  try {
    return fn(py::module_::import("dopt.rpc"));
  } catch (py::error_already_set& e) {
    const std::string text = what + " raised " + e.what();
    if (e.matches(PyExc_ValueError)) throw ValueError("rpc", text);
    if (e.matches(PyExc_TypeError)) throw TypeError("rpc", text);
    if (e.matches(PyExc_KeyError)) throw KeyError("rpc", text);
    throw Error("rpc", text);
  }
}

void register_python_functions() {
  static const bool done = [] {
    rpc::register_function(kCall, [](const std::string& mod, const std::string& qual, const std::string& payload) {
      return with_python(mod + "." + qual, [&](py::module_ r) {
        return r.attr("_run_pickled")(mod, qual, py::bytes(payload)).cast<std::string>();
      });
    });
    rpc::register_function(kRemoteTensor,
                           [](const std::string& mod, const std::string& qual, const std::string& payload) {
                             return with_python(mod + "." + qual, [&](py::module_ r) {
                               py::object cap = r.attr("_run_for_tensor")(mod, qual, py::bytes(payload));
                               return from_capsule(cap.cast<py::capsule>(), true);
                             });
                           });
    optim::DistributedOptimizer::register_functions();
    return true;
  }();
  (void)done;
}

rpc::To to_of(const py::object& to) {
  if (py::isinstance<py::int_>(to)) return rpc::To(to.cast<int>());
  return rpc::To(to.cast<std::string>());
}

rpc::Fn fn_of(const char* name, double timeout_s) {
  rpc::Fn f(name);
  if (timeout_s > 0) f.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
  return f;
}

using BytesFuture = Future<std::string>;

}  // namespace

void bind_rpc(py::module_& m) {
  register_python_functions();
  auto r = m.def_submodule("rpc", "dopt::rpc");

  py::class_<rpc::WorkerInfo>(r, "WorkerInfo")
      .def_readonly("name", &rpc::WorkerInfo::name)
      .def_readonly("id", &rpc::WorkerInfo::rank)
      .def("__repr__", [](const rpc::WorkerInfo& w) {
        return "WorkerInfo(id=" + std::to_string(w.rank) + ", name=" + w.name + ")";
      });

  py::class_<BytesFuture>(r, "BytesFuture")
      .def("wait",
           [](const BytesFuture& f) {
             std::string s;
             {
               py::gil_scoped_release release;  // a call to this very worker needs the GIL to run
               s = f.get();
             }
             return py::bytes(s);
           })
      .def("done", &BytesFuture::is_ready);

  py::class_<rpc::RRef<Tensor>>(r, "RRef")
      .def("owner", &rpc::RRef<Tensor>::owner)
      .def("owner_rank", &rpc::RRef<Tensor>::owner_rank)
      .def("is_owner", &rpc::RRef<Tensor>::is_owner)
      .def_property_readonly("id", &rpc::RRef<Tensor>::id)
      .def("to_here",
           [](const rpc::RRef<Tensor>& ref, double timeout_s) {
             std::optional<std::chrono::milliseconds> t;
             if (timeout_s > 0) t = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
             return ref.to_here(t);
           },
           py::arg("timeout") = 0.0, py::call_guard<py::gil_scoped_release>())
      .def("local_value", [](const rpc::RRef<Tensor>& ref) { return ref.local_value(); });

  py::class_<rpc::GradContext>(r, "GradContext")
      .def_property_readonly("id", &rpc::GradContext::id)
      .def(
          "deposit",
          [](rpc::GradContext& c, const rpc::RRef<Tensor>& p, const Tensor& g) { (void)c.deposit(p, g); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "deposit_all",
          [](rpc::GradContext& c, const std::vector<std::pair<rpc::RRef<Tensor>, Tensor>>& grads) {
            (void)c.deposit_all(grads);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "wait_deposits", [](const rpc::GradContext& c) { c.deposits_done().get(); },
          py::call_guard<py::gil_scoped_release>())
      .def("release", &rpc::GradContext::release, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("released", &rpc::GradContext::released);

  py::class_<rpc::Agent>(r, "Agent")
      .def_property_readonly("name", &rpc::Agent::name)
      .def_property_readonly("rank", &rpc::Agent::rank)
      .def_property_readonly("world_size", &rpc::Agent::world_size)
      .def("worker_info", [](const rpc::Agent& a) { return a.worker_info(); })
      .def("worker_info_of",
           [](const rpc::Agent& a, const py::object& w) {
             return py::isinstance<py::int_>(w) ? a.worker_info(w.cast<int>()) : a.worker_info(w.cast<std::string>());
           })
      .def("workers", &rpc::Agent::workers)
      .def(
          "call_async",
          [](const rpc::Agent& a, const py::object& to, const std::string& mod, const std::string& qual,
             const py::bytes& payload, double timeout_s) {
            rpc::To dest = to_of(to);
            std::string p = payload;
            py::gil_scoped_release release;
            return a.rpc_async<std::string>(dest, fn_of(kCall, timeout_s), mod, qual, p);
          })
      .def("remote_tensor",
           [](const rpc::Agent& a, const py::object& to, const std::string& mod, const std::string& qual,
              const py::bytes& payload, double timeout_s) {
             rpc::To dest = to_of(to);
             std::string p = payload;
             py::gil_scoped_release release;
             return a.remote<Tensor>(dest, fn_of(kRemoteTensor, timeout_s), mod, qual, p);
           })
      .def("make_rref", [](const rpc::Agent& a, const Tensor& t) { return a.make_rref(t); })
      .def("new_context", &rpc::Agent::new_context)
      .def("shutdown", &rpc::Agent::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("alive", &rpc::Agent::alive);

  r.def(
      "init",
      [](const std::string& name, int rank, int world_size, const std::string& master_addr, int master_port,
         double rpc_timeout_s, int num_worker_threads) {
        rpc::RpcOptions o;
        o.rpc_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(rpc_timeout_s * 1000));
        o.num_worker_threads = num_worker_threads;
        LaunchEnv env;
        env.rank = rank;
        env.world_size = world_size;
        env.local_rank = rank;
        env.local_world_size = world_size;
        env.master_addr = master_addr;
        env.master_port = master_port;
        env.source = "python";
        Runtime& rt = runtime();
        py::gil_scoped_release release;
        return rpc::init(rt, env, name, o);
      },
      py::arg("name"), py::arg("rank"), py::arg("world_size"), py::arg("master_addr"), py::arg("master_port"),
      py::arg("rpc_timeout_s"), py::arg("num_worker_threads"));

  py::class_<optim::DistributedOptimizer, GilFreeHolder<optim::DistributedOptimizer>>(r, "DistributedOptimizer")
      .def(py::init([](const rpc::Agent& agent, const std::string& name, const py::dict& hp,
                       const std::vector<rpc::RRef<Tensor>>& params) {
             Hyperparams h = hyper_from_py(hp, "DistributedOptimizer");
             py::gil_scoped_release release;  // waits for every owner
             return GilFreeHolder<optim::DistributedOptimizer>(
                 new optim::DistributedOptimizer(agent, optim::OptimizerSpec{name, h}, params));
           }),
           py::arg("agent"), py::arg("name"), py::arg("hyperparameters"), py::arg("params"))
      .def("step", [](optim::DistributedOptimizer& o, std::uint64_t ctx) { o.step_async(ctx).get(); },
           py::call_guard<py::gil_scoped_release>())
      .def("zero_grad", &optim::DistributedOptimizer::zero_grad, py::call_guard<py::gil_scoped_release>())
      .def("set_lr", &optim::DistributedOptimizer::set_lr, py::call_guard<py::gil_scoped_release>())
      .def("lrs", &optim::DistributedOptimizer::lrs, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_params", &optim::DistributedOptimizer::num_params);
}

}  // namespace dopt::python
