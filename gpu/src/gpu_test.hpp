#pragma once
// Shared by the GPU tests (gpu/src/*.test.cpp): a test that needs a CUDA
// device returns early without one. The message is what tests/CMakeLists.txt
// matches (SKIP_REGULAR_EXPRESSION) to report the test as skipped.
#include <catch2/catch.hpp>

#include "dopt/gpu/device.hpp"

#define DOPT_REQUIRE_CUDA()                      \
  do {                                           \
    if (!::dopt::gpu::init()) {                  \
      WARN("skipped: no CUDA device");           \
      SUCCEED("skipped: no CUDA device");        \
      return;                                    \
    }                                            \
  } while (0)
