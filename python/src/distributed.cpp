// The process's dopt Runtime, init_process_group and ProcessGroup.
#include <chrono>
#include <memory>
#include <mutex>

#include "convert.hpp"
#include "gil_free_delete.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/actors/runtime.hpp"
#include "runtime_holder.hpp"

namespace dopt::python {
namespace {

std::mutex g_mutex;
std::unique_ptr<Runtime> g_runtime;

ReduceOp reduce_op(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "avg") return ReduceOp::avg;
  if (name == "product") return ReduceOp::product;
  if (name == "min") return ReduceOp::min;
  if (name == "max") return ReduceOp::max;
  throw ValueError("ProcessGroup", "unknown reduce op '" + name + "' (sum, avg, product, min, max)");
}

}  // namespace

Runtime& runtime() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_runtime) g_runtime = std::make_unique<Runtime>(RuntimeOptions::from_env());
  return *g_runtime;
}

void shutdown_runtime() {
  std::unique_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    rt = std::move(g_runtime);
  }
  if (rt) rt->shutdown();
  // The Runtime object itself is kept: handles that still point into it
  // (process groups, agents) are destroyed later by Python's GC.
  (void)rt.release();
}

void bind_distributed(py::module_& m) {
  m.def(
      "init_process_group",
      [](int rank, int world_size, int local_rank, int local_world_size, const std::string& master_addr,
         int master_port, double timeout_s, const std::string& transport) {
        LaunchEnv env;
        env.rank = rank;
        env.world_size = world_size;
        env.local_rank = local_rank;
        env.local_world_size = local_world_size;
        env.master_addr = master_addr;
        env.master_port = master_port;
        env.source = "python";
        InitOptions o;
        o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
        o.transport = transport;
        Runtime& rt = runtime();
        py::gil_scoped_release release;
        return init_process_group(rt, env, o);
      },
      py::arg("rank"), py::arg("world_size"), py::arg("local_rank"), py::arg("local_world_size"),
      py::arg("master_addr"), py::arg("master_port"), py::arg("timeout_s"), py::arg("transport"),
      "Joins the world (a collective of every rank): rendezvous on master_addr:master_port.");
  m.def("shutdown", [] {
    py::gil_scoped_release release;
    shutdown_runtime();
  }, "Stops the runtime's actors and threads (at exit); later collectives fail.");

  py::class_<ProcessGroup, GilFreeHolder<ProcessGroup>>(m, "ProcessGroup", "A dopt process group.")
      .def_property_readonly("valid", &ProcessGroup::valid)
      .def("is_member", &ProcessGroup::is_member)
      .def("rank", &ProcessGroup::rank)
      .def("size", &ProcessGroup::size)
      .def_property_readonly("ranks", &ProcessGroup::ranks)
      .def("global_rank", &ProcessGroup::global_rank)
      .def("group_rank", &ProcessGroup::group_rank)
      .def_property_readonly("id", &ProcessGroup::id)
      .def("set_timeout", [](ProcessGroup& g, double s) {
        g.set_timeout(std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000)));
      })
      .def("new_group", &ProcessGroup::new_group, py::call_guard<py::gil_scoped_release>())
      .def(
          "new_subgroups",
          [](ProcessGroup& g, int size) {
            Subgroups s = g.new_subgroups(size);
            return std::make_pair(s.current, s.all);
          },
          py::call_guard<py::gil_scoped_release>())
      .def("barrier", &ProcessGroup::barrier, py::call_guard<py::gil_scoped_release>())
      .def("broadcast", &ProcessGroup::broadcast, py::call_guard<py::gil_scoped_release>())
      .def(
          "all_reduce",
          [](ProcessGroup& g, const Tensor& t, const std::string& op) {
            const ReduceOp r = reduce_op(op);
            py::gil_scoped_release release;
            g.all_reduce(t, r);
          },
          py::arg("tensor"), py::arg("op") = "sum")
      .def(
          "all_reduce_coalesced",
          [](ProcessGroup& g, const std::vector<Tensor>& ts, const std::string& op, const std::string& order,
             std::int64_t pre_divisor) {
            AllReduceCoalescedOptions o;
            o.op = reduce_op(op);
            if (order == "ring") o.order = ReduceOrder::ring;
            else if (order != "rank")
              throw ValueError("ProcessGroup.all_reduce_coalesced", "order must be 'rank' or 'ring', got '" + order + "'");
            o.pre_divisor = pre_divisor;
            py::gil_scoped_release release;
            g.all_reduce_coalesced(ts, o);
          },
          py::arg("tensors"), py::arg("op") = "sum", py::arg("order") = "rank", py::arg("pre_divisor") = 0)
      .def("all_gather", &ProcessGroup::all_gather, py::call_guard<py::gil_scoped_release>())
      .def("broadcast_coalesced", &ProcessGroup::broadcast_coalesced, py::call_guard<py::gil_scoped_release>());
}

}  // namespace dopt::python
