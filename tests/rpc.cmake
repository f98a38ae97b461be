# dopt::rpc and DistributedOptimizer between real processes
# (tests/rpc_multiprocess.test.cpp, tags [rpc][multiprocess]): tests/rpc_peer.cpp
# is one worker, started by dopt-run or by hand. The [multiprocess] label and
# 60 s timeout come from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  # rpc/testing.hpp (test hooks, not installed)
  # distributed_optimizer_survive_scenarios.hpp (test support, not installed)
  dopt_test_peer(rpc actors/src distributed/src)
endif()
