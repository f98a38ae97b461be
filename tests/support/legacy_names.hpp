#pragma once
// The namespaces tests/support had before dopt::testing, kept as aliases for
// the tests of actors/ and distributed/src/zero/ that still name them
// (dopt_test::RankLog, dopt::test::values, using namespace
// dopt::optim::test). Remove once those tests say dopt::testing.
namespace dopt::testing {}
namespace dopt_test = dopt::testing;
namespace dopt {
namespace test = testing;
namespace optim {
namespace test = ::dopt::testing;
}  // namespace optim
}  // namespace dopt
