// The built-in calls between agents (reference counts, gradient deposits,
// context releases, shutdown notes). They run on the agent actor itself.
#include "rpc/core.hpp"

namespace dopt::rpc::detail {

namespace {

template <class... A>
std::tuple<A...> builtin_args(Decoder& d) {
  std::tuple<A...> t;
  read(d, t);
  return t;
}

Tensor summed(const Tensor& a, const Tensor& b) {
  check_same_shape(a, b, "GradContext.deposit");
  check_same_dtype(a, b, "GradContext.deposit");
  Tensor out = a.clone();
  const auto n = out.numel();
  if (out.dtype() == DType::float32) {
    float* o = out.data<float>();
    const float* x = b.data<float>();
    for (std::int64_t i = 0; i < n; ++i) o[i] += x[i];
  } else if (out.dtype() == DType::float64) {
    double* o = out.data<double>();
    const double* x = b.data<double>();
    for (std::int64_t i = 0; i < n; ++i) o[i] += x[i];
  } else {
    throw NotSupportedError("GradContext.deposit", "summing two gradients of dtype " +
                                                       std::string(dtype_name(out.dtype())) +
                                                       " for one parameter (float32 and float64 only)");
  }
  return out;
}

}  // namespace

const std::map<std::string, Builtin>& builtins() {
  static const std::map<std::string, Builtin> b{
      {"__rref.add",
       [](AgentCore& c, int, Decoder& d) {
         auto [id, holder] = builtin_args<std::uint64_t, int>(d);
         c.count(id, holder, +1);
       }},
      {"__rref.del",
       [](AgentCore& c, int, Decoder& d) {
         auto [id, holder] = builtin_args<std::uint64_t, int>(d);
         c.count(id, holder, -1);
       }},
      {"__ctx.deposit",
       [](AgentCore& c, int, Decoder& d) {
         auto [ctx, grads] = builtin_args<std::uint64_t, std::vector<std::pair<std::uint64_t, Tensor>>>(d);
         {
           std::lock_guard<std::mutex> lock(c.obj_mutex);
           for (auto& [obj, g] : grads)
             if (!c.objects.count(obj))
               throw KeyError("GradContext.deposit", "value " + std::to_string(obj) + " is not owned by " +
                                                         c.who(c.rank) + " (freed?)", c.rank);
         }
         std::lock_guard<std::mutex> lock(c.ctx_mutex);
         auto& m = c.contexts[ctx];
         for (auto& [obj, g] : grads) {
           if (!g.defined()) continue;
           auto it = m.find(obj);
           if (it == m.end())
             m.emplace(obj, g);
           else
             it->second = summed(it->second, g);
         }
       }},
      {"__ctx.release",
       [](AgentCore& c, int, Decoder& d) {
         auto [ctx] = builtin_args<std::uint64_t>(d);
         std::lock_guard<std::mutex> lock(c.ctx_mutex);
         c.contexts.erase(ctx);
       }},
      {"__bye",
       [](AgentCore& c, int caller, Decoder&) {
         {
           std::lock_guard<std::mutex> lock(c.st_mutex);
           c.bye_from.insert(caller);
         }
         c.st_cv.notify_all();
       }},
  };
  return b;
}

}  // namespace dopt::rpc::detail
