#pragma once
// The documented reductions of dopt's collectives, computed here from their
// definition, for the tests that check a collective's result element by
// element (actors' unit tests, tests/collectives_peer.cpp). Pure functions.
#include <algorithm>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::testing {

/// op over value(0), ..., value(n - 1) in rank order, in double (exact for
/// the small integers the tests reduce); avg gives the sum: the caller
/// divides (avg_in below, or in double).
template <class Value>
double reduce_in_rank_order(ReduceOp op, int n, Value&& value) {
  double acc = value(0);
  for (int r = 1; r < n; ++r) {
    const double x = value(r);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc += x; break;
      case ReduceOp::product: acc *= x; break;
      case ReduceOp::min: acc = std::min(acc, x); break;
      case ReduceOp::max: acc = std::max(acc, x); break;
    }
  }
  return acc;
}

/// sum / n as dopt divides an avg of dtype dt: in double for float64, in
/// float32 otherwise (the accumulation type of the 16-bit floats).
inline double avg_in(DType dt, double sum, int n) {
  if (dt == DType::float64) return sum / n;
  return static_cast<double>(static_cast<float>(sum) / static_cast<float>(n));
}

}  // namespace dopt::testing
