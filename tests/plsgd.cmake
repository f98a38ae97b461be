# Post-local SGD, model averaging and the DDP gradient reducer between real
# processes (tests/plsgd_multiprocess.test.cpp, tags [plsgd][multiprocess]):
# tests/plsgd_peer.cpp is one rank, started by dopt-run or by hand. The
# [multiprocess] label and 60 s timeout come from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  dopt_test_peer(plsgd)
endif()
