#pragma once
// What every unit test of a local optimizer (optim/src/*.test.cpp) uses:
// its data, the bitwise checks against a reference, the Optimizer-base
// contract, and the names it reads unqualified (dopt's, dopt::optim's,
// dopt::testing's, Catch's string matchers). For *.test.cpp files only: it
// makes using-directives at file scope.
#include <catch2/catch.hpp>

#include "bitwise_checks.hpp"
#include "optimizer_contract.hpp"
#include "reference_data.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::testing;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
