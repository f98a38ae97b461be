# The library's multi-rank scenarios on the hierarchical plane, with the
# "hosts" played on this machine (DOPT_HOST_ID per rank): every rank must
# match its independently computed references bit for bit, as on one host.
if(TARGET dopt_tests)
  set(_as_hosts "${CMAKE_CURRENT_SOURCE_DIR}/as_hosts.sh")
  add_test(NAME "hier: ZeroRedundancyOptimizer parity, 2 hosts x 2 ranks"
           COMMAND ${_as_hosts} 2 2 $<TARGET_FILE:dopt_zero_peer> parity)
  add_test(NAME "hier: ZeRO with Join, 2 hosts x 2 ranks"
           COMMAND ${_as_hosts} 2 2 $<TARGET_FILE:dopt_zero_peer> join)
  add_test(NAME "hier: PostLocalSGDOptimizer with the periodic averager, 2 hosts x 2 ranks"
           COMMAND ${_as_hosts} 2 2 $<TARGET_FILE:dopt_plsgd_peer> periodic)
  add_test(NAME "hier: HierarchicalModelAverager on subgroups, 2 hosts x 2 ranks"
           COMMAND ${_as_hosts} 2 2 $<TARGET_FILE:dopt_plsgd_peer> hierarchical)
  add_test(NAME "hier: reducer with every comm hook, 3 hosts x 2 ranks"
           COMMAND ${_as_hosts} 3 2 $<TARGET_FILE:dopt_plsgd_peer> reducer)
  set_tests_properties("hier: ZeroRedundancyOptimizer parity, 2 hosts x 2 ranks"
                       "hier: ZeRO with Join, 2 hosts x 2 ranks"
                       "hier: PostLocalSGDOptimizer with the periodic averager, 2 hosts x 2 ranks"
                       "hier: HierarchicalModelAverager on subgroups, 2 hosts x 2 ranks"
                       "hier: reducer with every comm hook, 3 hosts x 2 ranks"
                       PROPERTIES LABELS "integration;multiprocess" TIMEOUT 120)
endif()
