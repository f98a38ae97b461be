# Growing a group between real processes (tests/replace_multiprocess.test.cpp,
# tags [replace][multiprocess]): tests/grow_peer.cpp is one rank, started by
# hand or by dopt-run; tests/zero_grow_peer.cpp is one rank of ZeRO growing
# back (its reference run shares zero_survive_reference.hpp with the
# simulated tests); tests/local_sgd_grow_peer.cpp is one rank of post-local
# SGD or DiLoCo growing back (its reference run is the simulated tests',
# distributed/src/local_sgd/grow_reference.hpp). Label and timeout from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  dopt_test_peer(grow)
  dopt_test_peer(zero_grow distributed/src)
  dopt_test_peer(local_sgd_grow distributed/src)
endif()
