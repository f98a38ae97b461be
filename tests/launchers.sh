#!/usr/bin/env bash
# A dopt program under the launchers people use, and on the MPI plane. Each
# scenario skips itself (exit 77, with the reason) when its launcher is not
# installed.
#
#   tests/launchers.sh SCENARIO BUILD_DIR
#
#   torchrun      plain torchrun (static rendezvous: its agent holds MASTER_PORT
#                 with its own store), 2 ranks
#   standalone    torchrun --standalone, 3 ranks
#   elastic-restart  torchrun's elastic agent (--nnodes 1:2, c10d rendezvous,
#                 --max_restarts 3), dopt-train on 2 ranks with checkpoints every
#                 20 steps: rank 1 SIGKILLed after step 45 in round 0; the agent
#                 starts round 1 (TORCHELASTIC_RESTART_COUNT=1, a new
#                 MASTER_PORT), which resumes at step 40 (20 when the save of
#                 40 was not complete) and ends bit for bit
#                 where an uninterrupted run under dopt-run ends; nothing of
#                 round 0's workers left in /dev/shm
#   static-restart   the same under torchrun's static rendezvous (its agent's
#                 store on MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True), rank 0
#                 killed: round 1 meets under the store's attempt_1 keys
#   elastic-grow  a second agent (a second torchrun, same rendezvous id) joins
#                 a running 2-rank job (--nnodes 1:2): torch's agents stop the
#                 workers (SIGTERM: dopt-train checkpoints the step it stops at)
#                 and start 4; dopt-train --elastic resumes there at 4 ranks and
#                 ends bit for bit where 2 ranks to that step, then a resume at
#                 4 ranks under dopt-run, end
#   elastic-shrink  two agents start a 4-rank job; the second "node" dies
#                 (its torchrun and workers SIGKILLed): the first agent starts
#                 round 1 alone, whose 2 ranks resume the 4 ranks' checkpoint
#                 with --elastic and end bit for bit where 4 ranks to that
#                 step, then 2 under dopt-run, end
#   slurm         3 ranks started with SLURM's variables only (as srun sets them)
#   srun          a real srun and sbatch on a SLURM cluster started here
#                 (tests/slurm_cluster.sh: two nodes, both this machine): the
#                 battery with srun -n 3; the launch contract every rank read
#                 (source slurm, local rank and size) for five placements on
#                 one and two nodes (SLURM_TASKS_PER_NODE as 3, "2,1" by
#                 SLURM_NODEID and "2(x2)", SLURM_NTASKS_PER_NODE); a batch
#                 script taking MASTER_ADDR from the node list; skips when
#                 SLURM is not installed or the cluster does not come up
#   mpi-battery   DOPT_BACKEND=mpi under mpirun, 3 ranks: every collective exact,
#                 on the mpi plane; a mismatch fails every rank; without
#                 mpirun it fails saying so
#   mpi-digest    DOPT_BACKEND=mpi under mpirun, 4 ranks: every result bit for bit
#                 that of 4 ranks on the shared-memory plane
#   mpi-zero      ZeroRedundancyOptimizer parity, and ZeRO with Join, on the mpi plane
#   mpi-plsgd     post-local SGD (both averagers) and the reducer's hooks, on the mpi plane
set -u
scenario=${1:?scenario}
build=$(cd "${2:?build dir}" && pwd)
peer=$build/tests/dopt_collectives_peer
work=$(mktemp -d /tmp/dopt-launchers.XXXXXX)
trap 'rm -rf "$work"' EXIT
skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; echo "--- output:"; tail -n 30 "$work/out"; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# every rank 0..N-1 printed "ok R" (anywhere on its line: launchers prefix lines)
all_ok() { for ((r = 0; r < $1; r++)); do grep -Eq "(^|[] :])ok $r [0-9]+" "$work/out" || fail "rank $r did not finish"; done; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
export DOPT_TIMEOUT_MS=${DOPT_TIMEOUT_MS:-60000}
torchrun() {
  /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || skip "torch (python3-torch) is not installed: no torchrun"
  /usr/bin/python3 -m torch.distributed.run "$@"
}
train=$build/tools/dopt-train
# elastic PORT ID [LAST_CALL]: in $ecmd, torchrun's elastic agent (2 workers
# of $work/worker.sh) with the c10d rendezvous on 127.0.0.1:PORT, run id ID;
# last_call_timeout LAST_CALL, default 1: a round closes 1 s after its first
# agent, not 30 s
elastic() {
  /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || skip "torch (python3-torch) is not installed: no torchrun"
  ecmd=(timeout 90 /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 --nnodes 1:2 --nproc_per_node 2
    --max_restarts 3 --monitor_interval 1 --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$1" --rdzv_id "$2"
    --rdzv_conf "last_call_timeout=${3:-1}" --no_python "$work/worker.sh")
}
# The worker of both restart scenarios: dopt-train on 2 ranks, 100 steps, a
# checkpoint every 20; in round 0 rank $1 dies (SIGKILL) after step 45.
restart_worker() {
  [ -x "$train" ] || fail "no $train: build the dopt-train target"
  cat >"$work/worker.sh" <<EOF
#!/bin/bash
echo "worker pid=\$\$ rank=\$RANK world=\$WORLD_SIZE restart=\$TORCHELASTIC_RESTART_COUNT master_port=\$MASTER_PORT agent_store=\$TORCHELASTIC_USE_AGENT_STORE"
extra=()
[ "\$TORCHELASTIC_RESTART_COUNT" = 0 ] && extra=(--kill-rank $1 --kill-at-step 45)
exec "$train" --steps 100 --hidden 64 --layers 2 --checkpoint-every 20 --checkpoint-dir "$work/ck" --resume \
  --log-every 20 --dump-params "$work/params.st" "\${extra[@]}"
EOF
  chmod +x "$work/worker.sh"
}
# After a job: none of its workers' segments left in /dev/shm (named
# /dopt-<pid>-...), and no rank failed to listen on its port
no_leftovers() {
  local pid
  for pid in $(sed -n 's/.*worker pid=\([0-9]*\) .*/\1/p' "$work/out"); do
    ! ls /dev/shm | grep -q "^dopt-$pid-" ||
      fail "worker $pid left $(ls /dev/shm | grep "^dopt-$pid-" | head -n 3 | tr '\n' ' ')in /dev/shm"
  done
  ! grep "rendezvous.*cannot listen\|is the port already in use" "$work/out" || fail "a rank could not listen on its port"
}
# Round 0 lost a rank after step 45; round 1 (restart 1) resumed from the
# last complete checkpoint and ended where an uninterrupted run ends. $1: TORCHELASTIC_USE_AGENT_STORE
check_restart() {
  for r in 0 1; do
    grep -q "worker pid=[0-9]* rank=$r world=2 restart=0 .*agent_store=$1" "$work/out" || fail "no rank $r in round 0"
    grep -q "worker pid=[0-9]* rank=$r world=2 restart=1 .*agent_store=$1" "$work/out" || fail "no rank $r in round 1"
  done
  # at step 40, or 20 when the kill came before the save of step 40 was complete
  # (a checkpoint is written in the background)
  local step
  step=$(sed -n "s|.*resuming from $work/ck/step-000000\([24]0\) at step \1\$|\1|p" "$work/out")
  [ -n "$step" ] || fail "round 1 did not resume at step 40 or 20"
  grep -q "dopt-train: $((100 - step)) steps in" "$work/out" || fail "round 1 did not train the $((100 - step)) steps left"
  no_leftovers
  "$build/tools/dopt-run" --master-port 0 --nproc-per-node 2 "$train" --steps 100 --hidden 64 --layers 2 --quiet \
    --dump-params "$work/ref.st" >"$work/ref.out" 2>&1 || { cat "$work/ref.out"; fail "the uninterrupted run failed"; }
  cmp -s "$work/params.st" "$work/ref.st" || fail "the parameters differ from the uninterrupted run's"
  echo "round 0: $(grep -m1 "worker pid=[0-9]* rank=0 .*restart=0" "$work/out" | sed 's/.*\(restart=.*\)/\1/')"
  echo "round 1: $(grep -m1 "worker pid=[0-9]* rank=0 .*restart=1" "$work/out" | sed 's/.*\(restart=.*\)/\1/')"
  echo "round 1 resumed at step $step; its parameters are byte for byte the uninterrupted run's"
}
mpi() {
  command -v mpirun >/dev/null || skip "OpenMPI's mpirun is not installed"
  grep -q "MPI plane enabled\|DOPT_HAVE_MPI:INTERNAL=ON" "$build/CMakeCache.txt" || skip "this build has no MPI plane"
  local np=$1
  shift
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" --mca btl self,vader,tcp \
    -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$(free_port)" -x DOPT_BACKEND=mpi -x DOPT_DEBUG=1 -x DOPT_TIMEOUT_MS \
    "$@"
}
on_mpi_plane() { [ "$(grep -c "the world group runs on the mpi plane" "$work/out")" = "$1" ] || fail "not every rank ran on the mpi plane"; }

case $scenario in
  torchrun)
    # Debian's torch 1.13: --nproc_per_node, --no_python for a binary, and
    # --redirects 1 --tee 1 (Python 3.11 crashes in its log handling without)
    torchrun --nproc_per_node 2 --master_port "$(free_port)" --no_python --redirects 1 --tee 1 \
      "$peer" battery >"$work/out" 2>&1 || fail "torchrun failed"
    all_ok 2
    ;;
  standalone)
    torchrun --standalone --nproc_per_node 3 --no_python --redirects 1 --tee 1 \
      "$peer" battery >"$work/out" 2>&1 || fail "torchrun --standalone failed"
    all_ok 3
    ;;
  elastic-restart)
    restart_worker 1
    elastic "$(free_port)" "elastic-$$"
    "${ecmd[@]}" >"$work/out" 2>&1 || fail "torchrun's elastic agent failed"
    check_restart False
    ;;
  static-restart)
    /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || skip "torch (python3-torch) is not installed: no torchrun"
    restart_worker 0
    torchrun --nproc_per_node 2 --max_restarts 3 --monitor_interval 1 --master_port "$(free_port)" --no_python \
      --redirects 1 --tee 1 "$work/worker.sh" >"$work/out" 2>&1 || fail "torchrun --max_restarts 3 failed"
    check_restart True
    ;;
  elastic-grow)
    [ -x "$train" ] || fail "no $train: build the dopt-train target"
    # 2 ranks train until stopped; 4 ranks train 60 steps past the checkpoint they resume from
    cat >"$work/worker.sh" <<EOF
#!/bin/bash
echo "worker pid=\$\$ rank=\$RANK world=\$WORLD_SIZE restart=\$TORCHELASTIC_RESTART_COUNT master_port=\$MASTER_PORT"
steps=1000000
if [ "\$WORLD_SIZE" = 4 ]; then
  last=\$(ls "$work/ck" | grep '^step-[0-9]*\$' | sort | tail -n 1)
  steps=\$((10#\${last#step-} + 60))
fi
exec "$train" --steps \$steps --hidden 64 --layers 2 --checkpoint-every 500 --keep-last 2 --checkpoint-dir "$work/ck" \
  --resume --elastic --log-every 500 --dump-params "$work/params.st"
EOF
    chmod +x "$work/worker.sh"
    port=$(free_port)
    elastic "$port" "grow-$$"
    "${ecmd[@]}" >"$work/out" 2>&1 &
    first=$!
    for ((i = 0; i < 300; i++)); do [ -d "$work/ck/step-00000500" ] && break; sleep 0.1; done
    [ -d "$work/ck/step-00000500" ] || fail "the first agent's 2 ranks wrote no checkpoint"
    "${ecmd[@]}" >"$work/out2" 2>&1 || {
      cat "$work/out2" >>"$work/out"
      fail "the second agent failed"
    }
    wait "$first" || fail "the first agent failed"
    cat "$work/out2" >>"$work/out"
    step=$(sed -n 's/.*resuming from .* at step \([0-9]*\)$/\1/p' "$work/out" | head -n 1)
    [ -n "$step" ] || fail "the 4 ranks did not resume"
    grep -q "interrupted after step $step of 1000000; checkpoint saved" "$work/out" ||
      fail "the 4 ranks did not resume where the agent stopped the 2"
    for r in 0 1 2 3; do grep -q "worker pid=[0-9]* rank=$r world=4 " "$work/out" || fail "no rank $r of 4"; done
    grep -q "the checkpoint was written by 2 ranks, this run has 4 (--elastic)" "$work/out" || fail "no resharding note"
    grep -q "dopt-train: 60 steps in" "$work/out" || fail "the 4 ranks did not train 60 steps"
    no_leftovers
    # the reference: 2 ranks to that step, then 4 ranks from its checkpoint, under dopt-run
    "$build/tools/dopt-run" --master-port 0 --nproc-per-node 2 "$train" --steps "$step" --hidden 64 --layers 2 --checkpoint-dir \
      "$work/ref" --quiet >"$work/ref.out" 2>&1 || { cat "$work/ref.out"; fail "the reference's 2 ranks failed"; }
    "$build/tools/dopt-run" --master-port 0 --nproc-per-node 4 "$train" --steps $((step + 60)) --hidden 64 --layers 2 --checkpoint-dir \
      "$work/ref" --resume --elastic --quiet --dump-params "$work/ref.st" >"$work/ref.out" 2>&1 ||
      { cat "$work/ref.out"; fail "the reference's 4 ranks failed"; }
    cmp -s "$work/params.st" "$work/ref.st" || fail "the parameters differ from the reference's"
    echo "2 ranks stopped at step $step by the agents' scale-up; 4 ranks resumed there;" \
      "parameters byte for byte the reference's"
    ;;
  elastic-shrink)
    [ -x "$train" ] || fail "no $train: build the dopt-train target"
    # 4 ranks train until stopped; 2 ranks train 60 steps past the checkpoint they resume from
    cat >"$work/worker.sh" <<EOF
#!/bin/bash
echo "worker pid=\$\$ rank=\$RANK world=\$WORLD_SIZE restart=\$TORCHELASTIC_RESTART_COUNT master_port=\$MASTER_PORT"
steps=1000000
if [ "\$WORLD_SIZE" = 2 ] && [ "\$TORCHELASTIC_RESTART_COUNT" != 0 ]; then
  last=\$(ls "$work/ck" | grep '^step-[0-9]*\$' | sort | tail -n 1)
  steps=\$((10#\${last#step-} + 60))
fi
exec "$train" --steps \$steps --hidden 64 --layers 2 --checkpoint-every 200 --keep-last 2 --checkpoint-dir "$work/ck" \
  --resume --elastic --log-every 200 --dump-params "$work/params.st"
EOF
    chmod +x "$work/worker.sh"
    # the first agent's round waits up to 10 s for the second (last_call_timeout)
    port=$(free_port)
    elastic "$port" "shrink-$$" 10
    "${ecmd[@]}" >"$work/out" 2>&1 &
    first=$!
    # The agent that binds the endpoint's port first hosts the c10d store: the
    # second starts once the first listens, so that killing it leaves the store
    # (with a fixed 0.5 s, the second won the race when torch's import took
    # longer, and its death failed the first with RendezvousConnectionError)
    for ((i = 0; i < 300; i++)); do ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
    ss -Hltn "sport = :$port" | grep -q . || fail "the first agent never listened on $port"
    # the second "node": a session of its own ($! is its leader), to end it whole
    setsid "${ecmd[@]}" >"$work/out2" 2>&1 &
    second=$!
    for ((i = 0; i < 600; i++)); do [ -d "$work/ck/step-00000400" ] && break; sleep 0.1; done
    [ -d "$work/ck/step-00000400" ] || fail "the 4 ranks wrote no checkpoint at step 400"
    grep -q "worker pid=[0-9]* rank=3 world=4 " "$work/out" "$work/out2" || fail "the job did not start with 4 ranks"
    kill -KILL -- -"$second" 2>/dev/null
    wait "$second" 2>/dev/null
    wait "$first" || fail "the first agent failed"
    cat "$work/out2" >>"$work/out"
    step=$(sed -n 's/.*resuming from .* at step \([0-9]*\)$/\1/p' "$work/out" | head -n 1)
    [ -n "$step" ] || fail "the 2 ranks did not resume"
    grep -q "the checkpoint was written by 4 ranks, this run has 2 (--elastic)" "$work/out" || fail "no resharding note"
    for r in 0 1; do grep -q "worker pid=[0-9]* rank=$r world=2 restart=1 " "$work/out" || fail "no rank $r in round 1"; done
    grep -q "dopt-train: 60 steps in" "$work/out" || fail "the 2 ranks did not train 60 steps"
    no_leftovers
    "$build/tools/dopt-run" --master-port 0 --nproc-per-node 4 "$train" --steps "$step" --hidden 64 --layers 2 --checkpoint-dir \
      "$work/ref" --quiet >"$work/ref.out" 2>&1 || { cat "$work/ref.out"; fail "the reference's 4 ranks failed"; }
    "$build/tools/dopt-run" --master-port 0 --nproc-per-node 2 "$train" --steps $((step + 60)) --hidden 64 --layers 2 --checkpoint-dir \
      "$work/ref" --resume --elastic --quiet --dump-params "$work/ref.st" >"$work/ref.out" 2>&1 ||
      { cat "$work/ref.out"; fail "the reference's 2 ranks failed"; }
    cmp -s "$work/params.st" "$work/ref.st" || fail "the parameters differ from the reference's"
    echo "the second node lost; round 1's 2 ranks resumed the 4 ranks' checkpoint of step $step;" \
      "parameters byte for byte the reference's"
    ;;
  slurm)
    port=$(free_port)
    pids=()
    for r in 0 1 2; do
      env -u RANK SLURM_PROCID=$r SLURM_NTASKS=3 SLURM_LOCALID=$r SLURM_TASKS_PER_NODE=3 SLURM_NODEID=0 \
        SLURM_JOB_ID=4242 SLURM_STEP_ID=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$peer" battery >"$work/out$r" 2>&1 &
      pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    cat "$work"/out? >"$work/out"
    [ $rc = 0 ] || fail "a rank failed"
    all_ok 3
    ;;
  srun)
    # two nodes, both this machine (tests/slurm_cluster.sh)
    . "$(dirname "${BASH_SOURCE[0]}")/slurm_cluster.sh"
    trap 'slurm_cluster_stop; rm -rf "$work"' EXIT
    if ! DOPT_SLURM_NODES=2 slurm_cluster_start "$work/slurm"; then
      slurm_cluster_logs
      skip "no SLURM cluster: $slurm_cluster_why"
    fi
    # srun does not set MASTER_ADDR / MASTER_PORT (docs/launching.md); -K: a
    # failed rank ends the others
    export MASTER_ADDR=127.0.0.1
    MASTER_PORT=$(free_port) timeout 60 srun -n 3 -K --label "$peer" battery >"$work/out" 2>&1 ||
      fail "srun -n 3 battery failed"
    all_ok 3
    echo "srun -n 3 battery: every rank ok"
    # The launch contract as each rank read it, against where SLURM (22.05,
    # as measured) puts the tasks. Each case: srun's arguments, then
    # rank:local_rank:local_world_size. -N 1 -n 3 sets
    # SLURM_TASKS_PER_NODE=3; --ntasks-per-node also SLURM_NTASKS_PER_NODE;
    # -N 2 -n 3 "2,1" (this node's entry by SLURM_NODEID); -c 4 (4 of the 8
    # CPUs a task) "2(x2)", block (ranks 0,1 on the first node) or cyclic
    # (ranks 0,2).
    for case in "-N 1 -n 3|0:0:3 1:1:3 2:2:3" "-N 1 -n 4 --ntasks-per-node 4|0:0:4 1:1:4 2:2:4 3:3:4" \
      "-N 2 -n 3|0:0:2 1:1:2 2:0:1" "-N 2 -n 4 -c 4|0:0:2 1:1:2 2:0:2 3:1:2" \
      "-N 2 -n 4 -c 4 -m cyclic|0:0:2 1:0:2 2:1:2 3:1:2"; do
      args=${case%%|*}
      read -ra argv <<<"$args"
      read -ra want <<<"${case#*|}"
      n=${#want[@]}
      # each task also prints what SLURM set, for the output of a failure
      MASTER_PORT=$(free_port) timeout 20 srun "${argv[@]}" -K --label bash -c \
        'echo "slurm set SLURM_PROCID=$SLURM_PROCID SLURM_NODEID=$SLURM_NODEID SLURM_LOCALID=$SLURM_LOCALID" \
           "SLURM_TASKS_PER_NODE=$SLURM_TASKS_PER_NODE SLURM_NTASKS_PER_NODE=${SLURM_NTASKS_PER_NODE-}"; exec "$0" launch' \
        "$peer" >"$work/out" 2>&1 || fail "srun $args launch failed"
      all_ok "$n"
      job=$(sed -n 's/.*launch 0 .* job_id=\([0-9]*\.[0-9]*\) job_id_from=SLURM_JOB_ID$/\1/p' "$work/out")
      [ -n "$job" ] || fail "srun $args: rank 0's job id is not SLURM_JOB_ID.SLURM_STEP_ID"
      for w in "${want[@]}"; do
        IFS=: read -r r lr lws <<<"$w"
        line="launch $r source=slurm world_size=$n local_rank=$lr local_world_size=$lws job_id=$job job_id_from=SLURM_JOB_ID"
        grep -qF "$line" "$work/out" || fail "srun $args: rank $r did not print '$line'"
      done
      echo "srun $args: every rank read source slurm, job $job, rank:local rank:local size ${want[*]}"
    done
    # a batch job as docs/launching.md shows it: MASTER_ADDR is the first
    # node of the job's node list (this host's name), srun inside the
    # allocation
    if ! getent hosts "$(hostname -s)" >/dev/null; then
      echo "sbatch: not run, this host's name '$(hostname -s)' does not resolve"
      echo "passed: $scenario (without sbatch)"
      exit 0
    fi
    cat >"$work/job.sh" <<'EOF'
#!/bin/bash
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
echo "MASTER_ADDR=$MASTER_ADDR"
srun --label "$DOPT_TEST_PEER" launch
EOF
    DOPT_TEST_PEER=$peer MASTER_PORT=$(free_port) timeout 30 sbatch --wait --quiet -N 2 -n 2 -o "$work/out" "$work/job.sh" ||
      fail "sbatch -N 2 -n 2 (srun inside) failed"
    all_ok 2
    for r in 0 1; do
      grep -Eq "launch $r source=slurm world_size=2 local_rank=0 local_world_size=1 job_id=[0-9]+\.0 " "$work/out" ||
        fail "sbatch: rank $r did not read the contract of the srun step"
    done
    echo "sbatch -N 2 -n 2, srun inside: $(grep -m1 MASTER_ADDR= "$work/out") (the first node), both ranks ok"
    ;;
  mpi-battery)
    mpi 3 "$peer" battery >"$work/out" 2>&1 || fail "mpirun failed"
    all_ok 3
    on_mpi_plane 3
    grep -q "plane mpi " "$work/out" || fail "plane_stats() does not name the mpi plane"
    # a mismatch (rank 0 all_reduce, the others broadcast) fails every rank
    mpi 3 "$peer" mismatch >"$work/out" 2>&1 && fail "mpirun exited 0 after a mismatch"
    [ "$(grep -c "error CollectiveMismatchError: .*collective mismatch in world group at seq 0" "$work/out")" = 3 ] ||
      fail "not every rank got CollectiveMismatchError"
    grep -m1 "error CollectiveMismatchError" "$work/out"
    # DOPT_BACKEND=mpi without mpirun: every rank says so
    "$build/tools/dopt-run" --nproc-per-node 2 --master-port 0 env DOPT_BACKEND=mpi "$peer" battery >"$work/out" 2>&1 &&
      fail "DOPT_BACKEND=mpi under dopt-run did not fail"
    grep -q "start the ranks with mpirun or srun" "$work/out" || fail "no error saying to start the ranks with mpirun"
    ;;
  mpi-digest)
    mpi 4 "$peer" digest >"$work/out" 2>&1 || fail "mpirun failed"
    all_ok 4
    on_mpi_plane 4
    cp "$work/out" "$work/mpi"
    "$build/tools/dopt-run" --nproc-per-node 4 --master-port 0 "$peer" digest >"$work/out" 2>&1 || fail "dopt-run failed"
    for ((r = 0; r < 4; r++)); do
      a=$(sed -n "s/.*digest $r \([0-9a-f]*\)$/\1/p" "$work/mpi")
      b=$(sed -n "s/.*digest $r \([0-9a-f]*\)$/\1/p" "$work/out")
      [ -n "$a" ] && [ "$a" = "$b" ] || fail "rank $r: digest on the mpi plane '$a' != on shared memory '$b'"
      echo "rank $r: digest $a on the mpi plane and on shared memory"
    done
    ;;
  mpi-zero)
    mpi 3 "$build/tests/dopt_zero_peer" parity >"$work/out" 2>&1 || fail "mpirun (parity) failed"
    all_ok 3
    on_mpi_plane 3
    mpi 3 "$build/tests/dopt_zero_peer" join >"$work/out" 2>&1 || fail "mpirun (join) failed"
    all_ok 3
    ;;
  mpi-plsgd)
    for mode in periodic hierarchical reducer; do
      mpi 4 "$build/tests/dopt_plsgd_peer" $mode >"$work/out" 2>&1 || fail "mpirun ($mode) failed"
      all_ok 4
      on_mpi_plane 4
    done
    ;;
  *)
    echo "unknown scenario $scenario"
    exit 2
    ;;
esac
echo "passed: $scenario"
