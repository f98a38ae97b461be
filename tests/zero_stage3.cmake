# ZeRO stage 3 between real processes (tests/zero_stage3_multiprocess.test.cpp,
# tags [zero][zero3][multiprocess]): tests/zero_stage3_peer.cpp is one rank,
# started by dopt-run. The [multiprocess] label and 60 s timeout come from
# tests/rendezvous.cmake.
if(TARGET dopt_tests)
  dopt_test_peer(zero_stage3)
endif()
