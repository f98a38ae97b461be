# Recovery at scale (issue 46): the hidden [sim-scale] unit tests (1,024
# deterministic simulated ranks losing 8 at once under a fault plan).
# Label sim-scale, with bench/'s dopt_bench_sim_scale runs.
add_test(NAME "sim-scale: 1024 simulated ZeRO ranks with redundancy 1 lose 8 at once, bitwise the reference"
         COMMAND dopt_unit_tests "[sim-scale]")
set_tests_properties("sim-scale: 1024 simulated ZeRO ranks with redundancy 1 lose 8 at once, bitwise the reference"
                     PROPERTIES LABELS sim-scale TIMEOUT 300)
