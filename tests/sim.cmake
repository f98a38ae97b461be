# Deterministic simulation (actors/src/sim/): the library's multi-rank tests
# of ZeRO (with its overlap and Join), Join, the model averagers, post-local
# SGD, the Reducer with its comm hooks, RPC and DistributedOptimizer
# (rpc::simulate runs deterministically under DOPT_SIM_SEED too), and the
# recovery from a lost rank, under a bounded swarm of seeds.
# Each seed runs the tests twice under DOPT_SIM_SEED and compares the traces
# (tests/sim_swarm.sh). Label: sim. More seeds: DOPT_SIM_SWARM_SEEDS.
set(DOPT_SIM_SWARM_SEEDS "1;2;3;4;5;6" CACHE STRING "Seeds of the CTest swarm (label sim)")
# The rank-loss recovery is in it too: ProcessGroup::shrink ([shrink]; the
# shm plane's own [shm] loss tests sleep in real time, so they stay out) and
# ZeRO, post-local SGD, the Reducer and DistributedOptimizer after a loss
# ([survive]).
set(_dopt_sim_filter
    "[zero],[join],[averagers],[reducer],[post_local_sgd],[comm_hooks],[rpc],[distributed_optimizer],[survive],[shrink]~[shm]")
foreach(_seed IN LISTS DOPT_SIM_SWARM_SEEDS)
  add_test(NAME "sim: swarm seed ${_seed}"
           COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/sim_swarm.sh" $<TARGET_FILE:dopt_unit_tests> ${_seed}
                   "${_dopt_sim_filter}")
  set_tests_properties("sim: swarm seed ${_seed}" PROPERTIES LABELS sim TIMEOUT 300)
endforeach()
