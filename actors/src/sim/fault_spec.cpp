// Fault plans as text (sim.hpp: parse_faults, DOPT_SIM_FAULTS).
#include <cstdlib>
#include <string>
#include <vector>

#include "dopt/actors/sim.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/settings.hpp"

namespace dopt::sim {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

[[noreturn]] void bad(const std::string& part, const std::string& why) {
  throw ValueError("sim::parse_faults", "fault '" + part + "': " + why);
}

long long integer(const std::string& part, const std::string& s) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0') bad(part, "'" + s + "' is not an integer");
  return v;
}

double number(const std::string& part, const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') bad(part, "'" + s + "' is not a number");
  return v;
}

void add(FaultPlan& plan, const std::string& part) {
  const auto f = split(part, ':');
  const std::string& kind = f[0];
  auto want = [&](std::size_t n, const char* form) {
    if (f.size() != n) bad(part, std::string("expected ") + form);
  };
  auto rank_at = [&](int& r, int& k) {
    r = static_cast<int>(integer(part, f[1]));
    k = static_cast<int>(integer(part, f[2]));
  };
  int r = 0, k = 0;
  if (kind == "crash" || kind == "stop" || kind == "drop") {
    want(3, (kind + ":RANK:K").c_str());
    rank_at(r, k);
    if (kind == "crash") plan.crash(r, k);
    else if (kind == "stop") plan.stop(r, k);
    else plan.drop_message(r, k);
  } else if (kind == "delay") {
    want(4, "delay:RANK:PROBABILITY:MS");
    plan.delay_messages(static_cast<int>(integer(part, f[1])), number(part, f[2]),
                        std::chrono::milliseconds(integer(part, f[3])));
  } else if (kind == "partition") {
    want(2, "partition:RANK,RANK,...[@MS]");
    const auto at = split(f[1], '@');
    if (at.size() > 2) bad(part, "more than one '@'");
    std::vector<int> side;
    for (const auto& x : split(at[0], ',')) side.push_back(static_cast<int>(integer(part, x)));
    plan.partition(std::move(side), std::chrono::milliseconds(at.size() == 2 ? integer(part, at[1]) : 0));
  } else if (kind == "fail_read" || kind == "corrupt_read") {
    want(2, (kind + ":PATH").c_str());
    if (kind == "fail_read") plan.fail_read(f[1]);
    else plan.corrupt_read(f[1]);
  } else {
    bad(part, "unknown kind '" + kind + "' (crash, stop, delay, drop, partition, fail_read, corrupt_read)");
  }
}

}  // namespace

FaultPlan parse_faults(const std::string& spec) {
  FaultPlan plan;
  for (const auto& part : split(spec, ';'))
    if (!part.empty()) add(plan, part);
  return plan;
}

std::optional<FaultPlan> env_faults() {
  const auto spec = settings::text("DOPT_SIM_FAULTS");
  if (!spec || spec->empty()) return std::nullopt;
  return parse_faults(*spec);
}

}  // namespace dopt::sim
