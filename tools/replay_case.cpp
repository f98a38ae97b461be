#include "replay_case.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dopt/optim/clip_grad.hpp"
#include "dopt/optim/registry.hpp"

namespace dopt::replay {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

[[noreturn]] void bad(const std::string& file, const std::string& problem) {
  throw IOError("load_case", file + ": " + problem);
}

const json& field(const json& obj, const char* key, const std::string& file, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) bad(file, where + " has no '" + key + "'");
  return *it;
}

std::int64_t as_int(const json& v, const std::string& file, const std::string& where) {
  if (!v.is_number_integer()) bad(file, where + " must be an integer, got " + v.dump());
  return v.get<std::int64_t>();
}

Hyperparams to_hyper(const json& obj, const std::string& file, const std::string& where) {
  // JSON null is Python's None. The only hyperparameter that takes it is
  // Muon's adjust_lr_fn, where None means "original"; anywhere else the
  // case is refused below (hyper_from_json has no null).
  json fixed = obj;
  if (auto it = fixed.find("adjust_lr_fn"); it != fixed.end() && it->is_null()) *it = "original";
  try {
    return hyper_from_json(fixed.dump(), "load_case");
  } catch (const Error& e) {
    bad(file, where + ": " + e.detail());
  }
}

}  // namespace

std::vector<optim::OptimizerParamGroup> case_param_groups(const Case& c, const std::vector<Tensor>& params) {
  // Through the public registry: each group's options are the defaults
  // updated with the group's overrides.
  std::vector<optim::OptimizerParamGroup> groups;
  for (const auto& g : c.groups) {
    std::vector<Tensor> ps;
    for (auto i : g.params) ps.push_back(params[static_cast<std::size_t>(i)]);
    Hyperparams h = c.defaults;
    for (const auto& [k, v] : g.overrides) h[k] = v;
    groups.emplace_back(std::move(ps), optim::make_options(optim::OptimizerSpec{c.optimizer_class, h}));
  }
  return groups;
}

std::unique_ptr<optim::Optimizer> make_case_optimizer(const Case& c, const std::vector<Tensor>& params) {
  return optim::make_optimizer(optim::OptimizerSpec{c.optimizer_class, c.defaults}, case_param_groups(c, params));
}

Case load_case(const std::string& dir) {
  Case c;
  c.dir = dir;
  if (!fs::is_directory(dir)) throw IOError("load_case", dir + ": not a directory");
  const std::string file = (fs::path(dir) / "case.json").string();
  std::ifstream in(file);
  if (!in) bad(file, "cannot open");
  std::stringstream buf;
  buf << in.rdbuf();
  json j;
  try {
    j = json::parse(buf.str());
  } catch (const json::exception& e) {
    bad(file, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(file, "must hold a JSON object");

  const json& format = field(j, "format", file, "case");
  if (!format.is_string() || format.get<std::string>() != "dopt-trace/1")
    bad(file, "format must be \"dopt-trace/1\", got " + format.dump());
  if (auto it = j.find("name"); it != j.end() && it->is_string()) c.name = it->get<std::string>();
  else c.name = fs::path(dir).filename().string();

  const json& dtype = field(j, "dtype", file, "case");
  if (dtype == "float32") c.dtype = DType::float32;
  else if (dtype == "float64") c.dtype = DType::float64;
  else bad(file, "dtype must be \"float32\" or \"float64\", got " + dtype.dump());

  // Checked before narrowing: 2^32 + 2 must not pass as 2. Every simulated
  // rank is a thread with its own actor, so the count is bounded too.
  const std::int64_t world = as_int(field(j, "world_size", file, "case"), file, "world_size");
  if (world < 1 || world > kMaxReplayWorldSize)
    bad(file, "world_size must be in 1.." + std::to_string(kMaxReplayWorldSize) + ", got " + std::to_string(world));
  c.world_size = static_cast<int>(world);
  const std::int64_t steps = as_int(field(j, "steps", file, "case"), file, "steps");
  if (steps < 0 || steps > 1000000) bad(file, "steps out of range: " + std::to_string(steps));
  c.steps = static_cast<int>(steps);

  const json& params = field(j, "params", file, "case");
  if (!params.is_array()) bad(file, "params must be an array");
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string where = "params[" + std::to_string(i) + "]";
    if (!params[i].is_object()) bad(file, where + " must be an object");
    const json& shape = field(params[i], "shape", file, where);
    if (!shape.is_array()) bad(file, where + ".shape must be an array");
    Shape s;
    for (const auto& d : shape) {
      const auto v = as_int(d, file, where + ".shape");
      if (v < 0) bad(file, where + ".shape has a negative dimension");
      s.push_back(v);
    }
    c.shapes.push_back(std::move(s));
  }

  const json& opt = field(j, "optimizer", file, "case");
  if (!opt.is_object()) bad(file, "optimizer must be an object");
  const json& cls = field(opt, "class", file, "optimizer");
  if (!cls.is_string()) bad(file, "optimizer.class must be a string");
  c.optimizer_class = cls.get<std::string>();
  const json& defaults = field(opt, "defaults", file, "optimizer");
  if (!defaults.is_object()) bad(file, "optimizer.defaults must be an object");
  c.defaults = to_hyper(defaults, file, "optimizer.defaults");

  const json& groups = field(j, "param_groups", file, "case");
  if (!groups.is_array() || groups.empty()) bad(file, "param_groups must be a non-empty array");
  std::set<std::int64_t> seen;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const std::string where = "param_groups[" + std::to_string(gi) + "]";
    json g = groups[gi];
    if (!g.is_object()) bad(file, where + " must be an object");
    const json& ps = field(g, "params", file, where);
    if (!ps.is_array()) bad(file, where + ".params must be an array");
    CaseGroup cg;
    for (const auto& p : ps) {
      const auto i = as_int(p, file, where + ".params");
      if (i < 0 || i >= static_cast<std::int64_t>(c.shapes.size()))
        bad(file, where + ".params: index " + std::to_string(i) + " out of range");
      if (!seen.insert(i).second) bad(file, "parameter " + std::to_string(i) + " is in more than one group");
      cg.params.push_back(i);
    }
    g.erase("params");
    cg.overrides = to_hyper(g, file, where);
    c.groups.push_back(std::move(cg));
  }
  if (seen.size() != c.shapes.size()) bad(file, "some parameters are in no param group");

  const json& wrapper = field(j, "wrapper", file, "case");
  if (!wrapper.is_object()) bad(file, "wrapper must be an object");
  const json& kind = field(wrapper, "kind", file, "wrapper");
  if (!kind.is_string()) bad(file, "wrapper.kind must be a string");
  c.wrapper_kind = kind.get<std::string>();
  if (c.wrapper_kind == "local" && c.world_size != 1) bad(file, "wrapper 'local' needs world_size 1");
  // A field this replayer does not know must refuse the case, not be ignored.
  std::set<std::string> known = {"kind"};
  if (c.wrapper_kind == "local" || c.wrapper_kind == "zero") known.insert({"lr_scheduler", "clip_grad_norm"});
  if (c.wrapper_kind == "zero") known.insert("parameters_as_bucket_view");
  if (c.wrapper_kind == "post_local_sgd") known.insert("averager");
  if (c.wrapper_kind == "diloco")
    known.insert({"sync_every", "fragments", "fragment_sync_delay", "fragment_update_alpha", "outer_optimizer"});
  if (c.wrapper_kind == "local" || c.wrapper_kind == "zero" || c.wrapper_kind == "post_local_sgd" ||
      c.wrapper_kind == "diloco")
    for (auto it = wrapper.begin(); it != wrapper.end(); ++it)
      if (!known.count(it.key()))
        throw UnsupportedCase("load_case", "wrapper field '" + it.key() + "' of wrapper '" + c.wrapper_kind +
                                               "' is not supported");
  if (auto it = wrapper.find("lr_scheduler"); it != wrapper.end()) {
    if (!it->is_object() || !it->contains("class") || !it->contains("args"))
      bad(file, "wrapper.lr_scheduler must be an object with 'class' and 'args'");
    c.lr_scheduler = it->dump();
  }
  if (auto it = wrapper.find("clip_grad_norm"); it != wrapper.end()) {
    if (!it->is_object()) bad(file, "wrapper.clip_grad_norm must be an object");
    for (auto k = it->begin(); k != it->end(); ++k)
      if (k.key() != "max_norm" && k.key() != "norm_type" && k.key() != "error_if_nonfinite")
        throw UnsupportedCase("load_case", "clip_grad_norm field '" + k.key() + "' is not supported");
    Case::Clip clip;
    const json& mn = field(*it, "max_norm", file, "wrapper.clip_grad_norm");
    if (!mn.is_number()) bad(file, "wrapper.clip_grad_norm.max_norm must be a number");
    clip.max_norm = mn.get<double>();
    if (auto nt = it->find("norm_type"); nt != it->end()) {
      if (nt->is_string() && nt->get<std::string>() == "inf") clip.norm_type = optim::kInfNorm;
      else if (nt->is_number()) clip.norm_type = nt->get<double>();
      else bad(file, "wrapper.clip_grad_norm.norm_type must be a number or \"inf\"");
    }
    if (auto e = it->find("error_if_nonfinite"); e != it->end() && !(e->is_boolean() && !e->get<bool>()))
      throw UnsupportedCase("load_case", "clip_grad_norm with error_if_nonfinite true is not supported");
    c.clip_grad_norm = clip;
  }
  {
    // An optimizer class the registry does not know: a case this build cannot replay.
    const auto names = optim::registered_optimizers();
    if (std::find(names.begin(), names.end(), c.optimizer_class) == names.end())
      throw UnsupportedCase("load_case", "optimizer class '" + c.optimizer_class + "' is not supported");
  }

  const std::string tfile = (fs::path(dir) / "tensors.safetensors").string();
  c.tensors = read_safetensors(tfile).tensors;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) {
    const std::string key = "init." + std::to_string(i);
    auto it = c.tensors.find(key);
    if (it == c.tensors.end()) bad(tfile, "no tensor '" + key + "'");
    if (it->second.shape() != c.shapes[i] || it->second.dtype() != c.dtype)
      bad(tfile, "'" + key + "' is " + it->second.str() + ", expected " + std::string(dtype_name(c.dtype)) + " " +
                     shape_str(c.shapes[i]));
  }
  return c;
}

void set_case_grads(const Case& c, int t, int r, const std::vector<Tensor>& params) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string key = "grad." + std::to_string(t) + "." + std::to_string(r) + "." + std::to_string(i);
    auto it = c.tensors.find(key);
    if (it == c.tensors.end()) {
      params[i].set_grad(Tensor());
      continue;
    }
    if (it->second.shape() != c.shapes[i] || it->second.dtype() != c.dtype)
      bad((fs::path(c.dir) / "tensors.safetensors").string(),
          "'" + key + "' is " + it->second.str() + ", expected " + std::string(dtype_name(c.dtype)) + " " +
              shape_str(c.shapes[i]));
    params[i].set_grad(it->second.clone());
  }
}

void record_grad_norm(const Case& c, int t, int r, double total, std::map<std::string, Tensor>& out) {
  out["grad_norm." + std::to_string(t) + "." + std::to_string(r)] = Tensor::scalar(total, c.dtype);
}

void clip_case_grads(const Case& c, int t, int r, const std::vector<Tensor>& params,
                     std::map<std::string, Tensor>& out) {
  if (!c.clip_grad_norm) return;
  optim::ClipGradNormOptions o;
  o.norm_type = c.clip_grad_norm->norm_type;
  record_grad_norm(c, t, r, optim::clip_grad_norm(params, c.clip_grad_norm->max_norm, o), out);
}

void record_case_params(int t, int r, const std::vector<Tensor>& params, std::map<std::string, Tensor>& out) {
  for (std::size_t i = 0; i < params.size(); ++i)
    out["param." + std::to_string(t) + "." + std::to_string(r) + "." + std::to_string(i)] = params[i].clone();
}

ReplayOutput replay_case(const Case& c, int num_threads) {
  if (c.wrapper_kind == "zero") return replay_zero(c, num_threads);
  if (c.wrapper_kind == "post_local_sgd") return replay_post_local_sgd(c, num_threads);
  if (c.wrapper_kind == "diloco") return replay_diloco(c, num_threads);
  if (c.wrapper_kind != "local")
    throw UnsupportedCase("replay", "wrapper '" + c.wrapper_kind + "' is not supported");
  const std::size_t n = c.shapes.size();
  std::vector<Tensor> params;
  for (std::size_t i = 0; i < n; ++i) params.push_back(c.tensors.at("init." + std::to_string(i)).clone());

  auto opt = make_case_optimizer(c, params);
  opt->set_num_threads(num_threads);

  ReplayOutput out;
  const int r = 0;
  std::unique_ptr<CaseScheduler> sched;
  if (!c.lr_scheduler.empty()) {
    sched = std::make_unique<CaseScheduler>(c, optim::ScheduleTarget(*opt));
    sched->record("init", out.tensors);
  }
  for (int t = 0; t < c.steps; ++t) {
    set_case_grads(c, t, r, params);
    clip_case_grads(c, t, r, params, out.tensors);
    opt->step();
    if (sched) {
      sched->step(t);
      sched->record(std::to_string(t), out.tensors);
    }
    record_case_params(t, r, params, out.tensors);
  }

  // State: state_dict() indexes parameters by their position in the chain of
  // groups; map those back to the case's global indices.
  std::vector<std::int64_t> chain;
  for (const auto& g : c.groups) chain.insert(chain.end(), g.params.begin(), g.params.end());
  const StateDict sd = opt->state_dict();
  for (const auto& [pos, st] : sd.state) {
    if (pos < 0 || pos >= static_cast<std::int64_t>(chain.size()))
      throw StateError("replay", "optimizer state for unknown parameter position " + std::to_string(pos));
    const std::int64_t gidx = chain[static_cast<std::size_t>(pos)];
    for (const auto& [key, t] : st) {
      if (!t.defined()) continue;
      out.tensors["state." + std::to_string(r) + "." + std::to_string(gidx) + "." + key] = t.to(c.dtype);
    }
  }
  out.metadata["format"] = "dopt-trace/1";
  out.metadata["generator"] = "dopt-replay";
  return out;
}

}  // namespace dopt::replay
