// What an outgoing call is, in the user's words, for the errors that name
// it: the RRef operation or the function the user called, the worker it went
// to, and the internal function second (docs/troubleshooting.md).
#include <map>
#include <mutex>

#include "dopt/actors/internal/call_label.hpp"
#include "rpc/core.hpp"

namespace dopt {
namespace {

std::mutex g_names_mutex;
std::map<std::string, std::string>& public_names() {
  static std::map<std::string, std::string> names;
  return names;
}

}  // namespace

namespace detail {

void name_rpc_function(const std::string& fn, const std::string& public_call) {
  std::lock_guard<std::mutex> lock(g_names_mutex);
  public_names()[fn] = public_call;
}

std::string rpc_function_call(const std::string& fn) {
  std::lock_guard<std::mutex> lock(g_names_mutex);
  auto it = public_names().find(fn);
  return it == public_names().end() ? std::string() : it->second;
}

}  // namespace detail

namespace rpc::detail {

std::string user_call_text(const std::string& fn) {
  if (fn == "__rref.fetch") return "RRef.to_here()";
  if (fn == "__rref.add") return "handing on an RRef";
  if (fn == "__rref.del") return "releasing an RRef";
  if (fn == "__ctx.deposit") return "GradContext.deposit()";
  if (fn == "__ctx.release") return "releasing a GradContext";
  if (fn == "__bye") return "the agent's shutdown";
  if (std::string p = ::dopt::detail::rpc_function_call(fn); !p.empty()) return p + " (internally '" + fn + "')";
  return "'" + fn + "'";
}

std::string call_text(const AgentCore& c, const CallSpec& spec, int dest) {
  const std::string who = c.who(dest);
  if (spec.fn == "__rref.fetch" || spec.fn == "__rref.del")
    return user_call_text(spec.fn) + " of a value owned by " + who;
  if (spec.fn == "__rref.add") return user_call_text(spec.fn) + " owned by " + who;
  if (spec.fn.rfind("__", 0) == 0) return user_call_text(spec.fn) + " on " + who;
  if (std::string p = ::dopt::detail::rpc_function_call(spec.fn); !p.empty())
    return p + " on " + who + " (internally '" + spec.fn + "')";
  if (spec.mode == Mode::method) return "RRef method '" + spec.fn + "' on a value owned by " + who;
  if (spec.mode == Mode::remote) return "remote '" + spec.fn + "' on " + who;
  return "rpc '" + spec.fn + "' to " + who;
}

}  // namespace rpc::detail
}  // namespace dopt
