# ZeRO stage 2 between real processes (tests/zero_stage2_multiprocess.test.cpp,
# tags [zero][stage2][multiprocess]): tests/zero_stage2_peer.cpp is one rank,
# started by dopt-run. The [multiprocess] label and 60 s timeout come from
# tests/rendezvous.cmake.
if(TARGET dopt_tests)
  dopt_test_peer(zero_stage2)
endif()
