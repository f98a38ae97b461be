#!/usr/bin/python3
"""Real runs of all_reduce on the shared-memory plane over a sweep of sizes, with the network model's
host parameters measured just before each (for trying a rule of the model against more sizes than
compare_network_model.py's three).

    /usr/bin/python3 bench/sweep_network_model.py BUILD_DIR ROUNDS OUT.jsonl

Each round: the host's memory and cache traffic and the cache's effective size (as
compare_network_model.py), then for 2 and 4 processes: dopt_bench_sim exchange (every line), a
wake-up, the load, and dopt_bench_collectives all_reduce at 8 B, 4, 16, 64, 256 KiB, 1, 4 and 64 MiB
(medians). Appends one JSON line per round and process count.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_network_model as c  # noqa: E402

SIZES = [8, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 64 << 20]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    build, rounds, out = os.path.abspath(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    cores = os.cpu_count() or 1
    with open(out, "a") as f:
        for rnd in range(rounds):
            mem = c.memory_traffic_gbs(cores, tries=1)
            cache = c.memory_traffic_gbs(cores, n=1 << 20, reps=256, tries=1)
            cache_bytes, _ = c.effective_cache_bytes(cores, cache, mem)
            for n in (2, 4):
                exchange = c.json_lines(c.run([build + "/bench/dopt_bench_sim", "exchange"]))
                wake = c.wake_us(build)
                load = c.load()
                rs = c.shm_collective(build, n, SIZES)
                rec = dict(round=rnd, procs=n, mem=mem, cache=cache, cache_bytes=cache_bytes, wake=wake,
                           exchange=exchange, load=load, meas={r["bytes"]: r["median_us"] for r in rs})
                f.write(json.dumps(rec) + "\n")
                f.flush()
                print(n, load, rec["meas"], flush=True)


if __name__ == "__main__":
    main()
