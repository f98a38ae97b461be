// The MPI plane's scratch buffers: reused after a call that ends normally,
// never after one that ends by an exception (its MPI requests may still
// write the buffer).
#include "transport/mpi/scratch.hpp"

#include <catch2/catch.hpp>

#include <stdexcept>

using dopt::detail::mpi::Scratch;
using dopt::detail::mpi::ScratchPool;

namespace {

constexpr std::size_t k_mib = std::size_t(1) << 20;

// Takes a scratch buffer in its destructor, which runs while an exception
// unwinds the stack: that buffer's own scope ends normally.
struct TakesWhileUnwinding {
  ScratchPool& pool;
  char** seen;
  ~TakesWhileUnwinding() {
    Scratch s(pool);
    *seen = s.get(k_mib);
  }
};

}  // namespace

TEST_CASE("mpi scratch: a call's buffer is reused, one left by an exception is quarantined and never reused",
          "[mpi][scratch]") {
  ScratchPool pool;
  char* first = nullptr;
  {
    Scratch s(pool);
    first = s.get(k_mib);
    REQUIRE(first != nullptr);
    CHECK(s.get(k_mib / 2) == first);  // fits: kept
  }
  CHECK(pool.quarantined_bytes() == 0);
  CHECK(pool.buffers.free_bytes() >= k_mib);
  char* failed = nullptr;
  try {
    Scratch s(pool);
    failed = s.get(k_mib);
    CHECK(failed == first);  // the pool's buffer, reused
    throw std::runtime_error("the wait failed");
  } catch (const std::runtime_error&) {
  }
  CHECK(pool.quarantined_bytes() >= k_mib);
  CHECK(pool.buffers.free_bytes() == 0);
  for (int i = 0; i < 3; ++i) {
    Scratch s(pool);
    CHECK(s.get(k_mib) != failed);
  }
  CHECK(pool.quarantined_bytes() >= k_mib);
  CHECK(pool.quarantined_bytes() < 3 * k_mib);
}

TEST_CASE("mpi scratch: growing gives the smaller buffer back, and a scope that ends normally during unwinding reuses",
          "[mpi][scratch]") {
  ScratchPool pool;
  char* small = nullptr;
  {
    Scratch s(pool);
    small = s.get(k_mib);
    char* big = s.get(4 * k_mib);
    CHECK(big != small);
    CHECK(pool.buffers.free_bytes() >= k_mib);  // the 1 MiB buffer went back
  }
  char* during = nullptr;
  try {
    TakesWhileUnwinding t{pool, &during};
    throw std::runtime_error("unwinding");
  } catch (const std::runtime_error&) {
  }
  CHECK(during != nullptr);
  CHECK(pool.quarantined_bytes() == 0);  // that scratch's own scope ended normally
}
