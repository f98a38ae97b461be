// dopt-train's per-step finiteness scan (tools/dopt_train/finite.hpp): the
// first NaN or infinity anywhere, across its 1024-element blocks.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "../tools/dopt_train/finite.hpp"

TEST_CASE("dopt-train: the finiteness scan finds the first NaN or infinity at any position", "[train][unit]") {
  using dopt_train::first_nonfinite;
  for (std::int64_t n : {0, 1, 5, 1023, 1024, 1025, 5000}) {
    std::vector<float> v(static_cast<std::size_t>(n), 1.0f);
    if (n > 0) {
      v[0] = FLT_MAX;
      v.back() = -FLT_MIN / 4;  // denormal: finite
    }
    CHECK(first_nonfinite(v.data(), n) == -1);
    for (std::int64_t at : {std::int64_t{0}, n / 2, n - 1}) {
      if (n == 0) break;
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()}) {
        auto w = v;
        w[static_cast<std::size_t>(at)] = bad;
        if (at + 1 < n) w.back() = std::numeric_limits<float>::quiet_NaN();  // a later one does not count
        INFO("n " << n << " at " << at << " value " << bad);
        CHECK(first_nonfinite(w.data(), n) == at);
      }
    }
  }
}
