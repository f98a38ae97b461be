// RPC errors name what the user called and the worker it went to, never
// only an internal function ('__rref.fetch'): to_here() on a value whose
// owner is lost, a method on a value whose owner is dead. 3 and 5 simulated
// workers.
#include <catch2/catch.hpp>

#include <mutex>
#include <string>

#include "dopt/actors/rpc.hpp"
#include "rpc/testing.hpp"
#include "rpc_errors.hpp"
#include "served_checks.hpp"

using namespace dopt;
using namespace dopt::rpc;
using Catch::Matchers::Contains;
using dopt::testing::error_of;

namespace {

struct Tally {
  long n = 0;
};
void dopt_encode(Encoder& e, const Tally& t) { write(e, t.n); }
void dopt_decode(Decoder& d, Tally& t) { read(d, t.n); }

void register_error_functions() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_function("re.make_tally", [] { return Tally{5}; });
    register_method<Tally>("re.get", [](Tally& t) { return t.n; });
    // Kills the owner in the value's strand: the calls queued behind it are pending when it dies.
    register_method<Tally>("re.die_in_strand", [](Agent& a, Tally&) { rpc::testing::kill(a); });
    register_function("re.die", [](Agent& a) { rpc::testing::kill(a); });
  });
}

std::string owner_of(int r) { return "worker 'worker" + std::to_string(r) + "' (rank " + std::to_string(r) + ")"; }

}  // namespace

TEST_CASE("rpc errors name the user's call: to_here() of a value whose owner is lost while it waits, and after",
          "[rpc][call_label]") {
  register_error_functions();
  const int n = GENERATE(3, 5);
  simulate(n, [n](Agent& a) {
    if (a.rank() != 0) return;
    const int owner = n - 1;
    RRef<Tally> t = a.remote<Tally>(owner, "re.make_tally");
    auto dies = t.rpc_async("re.die_in_strand");
    auto fetched = t.to_here_async();  // queued behind re.die in the value's strand
    const std::string e = error_of([&] { fetched.get(); });
    SERVED_CHECK_THAT(e, Contains("PeerLostError") &&
                       Contains("RRef.to_here() of a value owned by " + owner_of(owner) + " from " + owner_of(0) +
                                " failed: " + owner_of(owner)) &&
                       !Contains("__rref"));
    (void)error_of([&] { dies.get(); });
    const std::string later = error_of([&] { t.to_here(); });
    SERVED_CHECK_THAT(later, Contains("PeerLostError") &&
                                 Contains("RRef.to_here() of a value owned by " + owner_of(owner)) &&
                           !Contains("__rref"));
  });
}

TEST_CASE("rpc errors name the user's call: a method on a value whose owner is dead names the method and the owner",
          "[rpc][call_label]") {
  register_error_functions();
  const int n = GENERATE(3, 5);
  simulate(n, [n](Agent& a) {
    if (a.rank() != 0) return;
    const int owner = n - 2;
    RRef<Tally> t = a.remote<Tally>(owner, "re.make_tally");
    (void)error_of([&] { a.rpc_sync(owner, "re.die"); });
    const std::string e = error_of([&] { t.rpc_sync<long>("re.get"); });
    SERVED_CHECK_THAT(e, Contains("PeerLostError") &&
                       Contains("RRef method 're.get' on a value owned by " + owner_of(owner) + " from " +
                                owner_of(0) + " failed: " + owner_of(owner)));
  });
}
