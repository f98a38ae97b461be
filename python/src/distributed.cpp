// The process's dopt Runtime, init_process_group and ProcessGroup.
#include <chrono>
#include <map>
#include <memory>
#include <mutex>

#include "convert.hpp"
#include "gil_free_delete.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/actors/runtime.hpp"
#include "dopt/runtime/settings.hpp"
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

/// The launch contract for the rank Python determined: this process's
/// environment (job id, secret, bind address, handshake timeout, port range:
/// validated as for C++ programs) with the rank, the sizes and the
/// rendezvous address replaced by Python's.
LaunchEnv launch_env_for(int rank, int world_size, int local_rank, int local_world_size,
                         const std::string& master_addr, int master_port) {
  std::map<std::string, std::string> vars;
  for (const auto& [k, v] : settings::environment()) {
    // Python already chose the rank, the sizes and where to meet.
    if (k.rfind("OMPI_COMM_WORLD_", 0) == 0 || k.rfind("SLURM_", 0) == 0 || k == "TORCHELASTIC_USE_AGENT_STORE")
      if (k != "SLURM_JOB_ID" && k != "SLURM_STEP_ID") continue;
    vars[k] = v;
  }
  vars["RANK"] = std::to_string(rank);
  vars["WORLD_SIZE"] = std::to_string(world_size);
  vars["LOCAL_RANK"] = std::to_string(local_rank);
  vars["LOCAL_WORLD_SIZE"] = std::to_string(local_world_size);
  vars["MASTER_ADDR"] = master_addr;
  vars["MASTER_PORT"] = std::to_string(master_port);
  LaunchEnv env = parse_launch_env(vars);
  env.source = "python";
  return env;
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
         int master_port, double timeout_s, const std::string& transport, const std::string& job_id,
         const std::string& secret) {
        LaunchEnv env = launch_env_for(rank, world_size, local_rank, local_world_size, master_addr, master_port);
        // The job id and the secret the ranks agreed on through torch's store
        // stand in where the environment sets none (docs/python.md).
        if (env.job_id.empty() && !job_id.empty()) {
          env.job_id = job_id;
          env.job_id_source = "torch's store";
        }
        if (env.secret.empty() && !secret.empty()) {
          env.secret = secret;
          env.secret_source = "a secret made by rank 0 and shared through torch's store";
        }
        InitOptions o;
        o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
        o.transport = transport;
        Runtime& rt = runtime();
        py::gil_scoped_release release;
        return init_process_group(rt, env, o);
      },
      py::arg("rank"), py::arg("world_size"), py::arg("local_rank"), py::arg("local_world_size"),
      py::arg("master_addr"), py::arg("master_port"), py::arg("timeout_s"), py::arg("transport"),
      py::arg("job_id") = "", py::arg("secret") = "",
      "Joins the world (a collective of every rank): rendezvous on master_addr:master_port. The rest of the "
      "launch contract (DOPT_SECRET, DOPT_JOB_ID, DOPT_BIND_ADDR, ...) is read from the environment; job_id "
      "and secret stand in where it sets none.");
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
      .def("timeout", [](const ProcessGroup& g) { return static_cast<double>(g.timeout().count()) / 1000.0; },
           "This rank's timeout on the group, in seconds.")
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
