// The settings table and its parser (dopt/runtime/settings.hpp).
#include "dopt/runtime/settings.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "thrown.hpp"

using namespace dopt;

namespace {

/// Sets variables for one scope, restoring what was there.
class Env {
 public:
  void set(const std::string& k, const std::string& v) {
    keep(k);
    ::setenv(k.c_str(), v.c_str(), 1);
  }
  void unset(const std::string& k) {
    keep(k);
    ::unsetenv(k.c_str());
  }
  ~Env() {
    for (const auto& [k, v] : saved_) {
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }

 private:
  void keep(const std::string& k) {
    for (const auto& s : saved_)
      if (s.first == k) return;
    const auto all = settings::environment();
    const auto it = all.find(k);
    saved_.emplace_back(k, it == all.end() ? std::nullopt : std::optional<std::string>(it->second));
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::string error_of(const std::function<void()>& f) { return dopt::testing::what_thrown<Error>(f); }

}  // namespace

TEST_CASE("settings: every name is declared once, with a known kind, a range where the kind needs one", "[settings]") {
  std::set<std::string> names;
  const std::set<std::string> kinds{"integer", "bytes", "unsigned", "flag", "choice", "text"};
  for (const auto& s : settings::table()) {
    INFO(s.name);
    CHECK(std::string(s.name).rfind("DOPT_", 0) == 0);
    CHECK(names.insert(s.name).second);
    CHECK(kinds.count(s.kind) == 1);
    CHECK(std::string(s.what).size() > 10);
    CHECK(std::string(s.default_text).size() > 0);
    const std::string kind = s.kind;
    if (kind == "integer" || kind == "bytes") CHECK(std::string(s.range).find("..") != std::string::npos);
    if (kind == "choice") CHECK(std::string(s.range).find('|') != std::string::npos);
  }
  CHECK_THROWS_AS(settings::declared("DOPT_NO_SUCH_THING"), StateError);
  CHECK_THROWS_AS(settings::flag("DOPT_TIMEOUT_MS"), StateError);  // read as another kind: a bug in dopt
}

TEST_CASE("settings: integers and byte counts, checked against their range", "[settings]") {
  Env env;
  env.unset("DOPT_TIMEOUT_MS");
  CHECK_FALSE(settings::integer("DOPT_TIMEOUT_MS").has_value());
  env.set("DOPT_TIMEOUT_MS", "");
  CHECK_FALSE(settings::integer("DOPT_TIMEOUT_MS").has_value());  // empty = unset
  env.set("DOPT_TIMEOUT_MS", "2500");
  CHECK(settings::integer("DOPT_TIMEOUT_MS") == 2500);
  env.set("DOPT_TIMEOUT_MS", "soon");
  CHECK(error_of([] { settings::integer("DOPT_TIMEOUT_MS"); })
            .find("DOPT_TIMEOUT_MS=\"soon\" is not a whole number in [1, 1000000000]") != std::string::npos);
  env.set("DOPT_TIMEOUT_MS", "0");
  CHECK_THROWS_AS(settings::integer("DOPT_TIMEOUT_MS"), ValueError);
  env.set("DOPT_TIMEOUT_MS", "10K");  // plain integers take no suffix
  CHECK_THROWS_AS(settings::integer("DOPT_TIMEOUT_MS"), ValueError);
  env.set("DOPT_SHM_BUFFER_BYTES", "8M");
  CHECK(settings::integer("DOPT_SHM_BUFFER_BYTES") == 8 << 20);
  env.set("DOPT_SHM_BUFFER_BYTES", "128KiB");
  CHECK(settings::integer("DOPT_SHM_BUFFER_BYTES") == 128 << 10);
  env.set("DOPT_SHM_BUFFER_BYTES", "1KB");  // below 64K
  CHECK(error_of([] { settings::integer("DOPT_SHM_BUFFER_BYTES"); })
            .find("is not a byte count (suffixes K, M, G, T) in [65536, 17179869184]") != std::string::npos);
  env.set("DOPT_SHM_BUFFER_BYTES", "-4M");
  CHECK_THROWS_AS(settings::integer("DOPT_SHM_BUFFER_BYTES"), ValueError);
  env.set("DOPT_SHM_BUFFER_BYTES", "4X");
  CHECK_THROWS_AS(settings::integer("DOPT_SHM_BUFFER_BYTES"), ValueError);
}

TEST_CASE("settings: flags, choices, seeds and text", "[settings]") {
  Env env;
  env.set("DOPT_SHM_CMA", "0");
  CHECK(settings::flag("DOPT_SHM_CMA") == false);
  env.set("DOPT_SHM_CMA", "yes");
  CHECK(error_of([] { settings::flag("DOPT_SHM_CMA"); }).find("DOPT_SHM_CMA=\"yes\" is not 0 or 1") != std::string::npos);
  env.set("DOPT_TRANSPORT", "tcp");
  CHECK(settings::text("DOPT_TRANSPORT") == "tcp");
  env.set("DOPT_TRANSPORT", "udp");
  CHECK(error_of([] { settings::text("DOPT_TRANSPORT"); }).find("DOPT_TRANSPORT=\"udp\" is not one of auto,shm,tcp") !=
        std::string::npos);
  env.set("DOPT_SIM_SEED", "0x2a");
  CHECK(settings::unsigned_integer("DOPT_SIM_SEED") == 42u);
  env.set("DOPT_SIM_SEED", "-1");
  CHECK_THROWS_AS(settings::unsigned_integer("DOPT_SIM_SEED"), ValueError);
  env.set("DOPT_HOST_ID", "rack7-node3");
  CHECK(settings::text("DOPT_HOST_ID") == "rack7-node3");
}

TEST_CASE("settings: a DOPT_ variable the table does not declare is named once, with the closest name", "[settings]") {
  Env env;
  env.set("DOPT_TIMOUT_MS", "1000");
  const auto names = settings::undeclared();
  CHECK(std::find(names.begin(), names.end(), "DOPT_TIMOUT_MS") != names.end());
  CHECK(settings::undeclared_note().find("DOPT_TIMOUT_MS (did you mean DOPT_TIMEOUT_MS?)") != std::string::npos);
  env.unset("DOPT_TIMOUT_MS");
  env.set("DOPT_ENTIRELY_UNRELATED_NAME", "1");
  const std::string far = settings::undeclared_note();
  CHECK(far.find("DOPT_ENTIRELY_UNRELATED_NAME") != std::string::npos);
  CHECK(far.find("DOPT_ENTIRELY_UNRELATED_NAME (did you mean") == std::string::npos);  // nothing close: no guess
}
