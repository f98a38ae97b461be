// Which ranks are on one host, measured (core/host_identity.hpp).
#include "core/host_identity.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>

#include "dopt/runtime/error.hpp"

using dopt::detail::HostIdentity;

namespace {
std::string info_of(const HostIdentity& id) { return id.host_field() + " addr=127.0.0.1 port=1" + id.probe_fields(); }
}  // namespace

TEST_CASE("host identity: ranks of one process share /dev/shm, a probe that cannot be mapped is named", "[host]") {
  ::unsetenv("DOPT_HOST_ID");
  HostIdentity a, b;
  CHECK(a.host_field() == b.host_field());
  CHECK(a.host_field().rfind("host=", 0) == 0);
  CHECK(a.probe_fields().find(" probe=/dopt-") == 0);
  CHECK(dopt::detail::network_namespace_id() == dopt::detail::network_namespace_id());
  std::vector<std::string> infos{info_of(a), info_of(b)};
  CHECK_NOTHROW(a.verify(infos, 0, "test"));
  CHECK_NOTHROW(b.verify(infos, 1, "test"));
  // A peer claiming this host whose segment is not in this /dev/shm
  infos.push_back(a.host_field() + " addr=x probe=/dopt-1-probe-nothere:0123456789abcdef0123456789abcdef");
  CHECK_THROWS_WITH(a.verify(infos, 0, "test"), Catch::Contains("rank 2 looks like it is on this host") &&
                                                    Catch::Contains("cannot open its segment /dopt-1-probe-nothere"));
  // The right segment with another token
  std::string forged = info_of(b);
  forged.replace(forged.size() - 32, 32, std::string(32, '0'));
  CHECK_THROWS_WITH(a.verify({info_of(a), forged}, 0, "test"), Catch::Contains("holds another token"));
  // Another host is not probed
  CHECK_NOTHROW(a.verify({info_of(a), "host=elsewhere addr=x probe=/nope:0"}, 0, "test"));
  b.release();
  CHECK_THROWS_WITH(a.verify({info_of(a), info_of(b)}, 0, "test"), Catch::Contains("sent no probe segment"));
}

TEST_CASE("host identity: DOPT_HOST_ID replaces the measurement", "[host]") {
  ::setenv("DOPT_HOST_ID", "rack7", 1);
  HostIdentity a;
  ::unsetenv("DOPT_HOST_ID");
  CHECK(a.host_field() == "host=rack7");
  CHECK(a.probe_fields().empty());
  CHECK_NOTHROW(a.verify({a.host_field() + " addr=x", a.host_field() + " addr=y"}, 0, "test"));
}
