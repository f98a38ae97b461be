"""dopt's process groups in Python, initialised from the launcher's
environment (torchrun, dopt-run, mpirun, srun: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT or their OpenMPI/SLURM forms).

Ports. torch needs MASTER_PORT for itself: under plain torchrun the agent's
store listens there, and ``torch.distributed.init_process_group`` creates its
store there otherwise. dopt's rendezvous therefore never uses MASTER_PORT
from Python. Its port is, in this order:

1. ``master_port=`` given to ``init_process_group`` / ``init_rpc``;
2. the environment variable ``DOPT_MASTER_PORT``;
3. a free port that rank 0 picks and hands to the other ranks through
   torch's store: torch's default store when ``torch.distributed`` is
   initialised, else torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE);
4. otherwise ``MASTER_PORT + 1`` (started alone: a free port).
"""
import atexit
import os
import socket
from datetime import timedelta

import torch

from . import _C
from ._tensor import to_dopt

__all__ = ["ProcessGroup", "init_process_group", "is_initialized", "get_world", "get_rank", "get_world_size",
           "new_group", "new_subgroups", "destroy_process_group"]

_world = None
_inits = {"pg": 0, "rpc": 0}
_store = None


class ProcessGroup:
    """A dopt process group (collectives on torch tensors, zero-copy)."""

    def __init__(self, c):
        self.c = c

    def rank(self):
        return self.c.rank()

    def size(self):
        return self.c.size()

    def is_member(self):
        return self.c.is_member()

    @property
    def ranks(self):
        return list(self.c.ranks)

    def global_rank(self, group_rank):
        return self.c.global_rank(group_rank)

    def group_rank(self, global_rank):
        return self.c.group_rank(global_rank)

    def set_timeout(self, seconds):
        self.c.set_timeout(float(seconds))

    def barrier(self):
        self.c.barrier()

    def broadcast(self, tensor, src):
        self.c.broadcast(to_dopt(tensor), src)

    def all_reduce(self, tensor, op="sum"):
        self.c.all_reduce(to_dopt(tensor), op)

    def all_reduce_coalesced(self, tensors, op="sum", order="rank", pre_divisor=0):
        """The tensors (one dtype) as one flat buffer, reduced in one call without a copy.
        order "ring" adds in gloo's order (torch's CPU results, bitwise); pre_divisor > 0
        divides every rank's values first (torch's model averaging in one pass)."""
        self.c.all_reduce_coalesced([to_dopt(t) for t in tensors], op, order, int(pre_divisor))

    def broadcast_coalesced(self, tensors, src):
        self.c.broadcast_coalesced([to_dopt(t) for t in tensors], src)

    def new_group(self, ranks):
        """A world collective: every rank calls it with the same ranks."""
        return ProcessGroup(self.c.new_group(sorted(ranks)))

    def new_subgroups(self, group_size=0):
        cur, all_groups = self.c.new_subgroups(group_size)
        return ProcessGroup(cur), [ProcessGroup(g) for g in all_groups]

    def __repr__(self):
        return f"dopt.ProcessGroup(ranks={self.ranks}, rank={self.rank()})"


class _LaunchEnv:
    def __init__(self):
        e = os.environ
        if "RANK" in e or "WORLD_SIZE" in e:
            self.rank, self.world_size = int(e["RANK"]), int(e["WORLD_SIZE"])
            self.local_rank = int(e.get("LOCAL_RANK", self.rank))
            self.local_world_size = int(e.get("LOCAL_WORLD_SIZE", self.world_size))
        elif "OMPI_COMM_WORLD_RANK" in e:
            self.rank, self.world_size = int(e["OMPI_COMM_WORLD_RANK"]), int(e["OMPI_COMM_WORLD_SIZE"])
            self.local_rank = int(e.get("OMPI_COMM_WORLD_LOCAL_RANK", self.rank))
            self.local_world_size = int(e.get("OMPI_COMM_WORLD_LOCAL_SIZE", self.world_size))
        elif "SLURM_PROCID" in e:
            self.rank = int(e["SLURM_PROCID"])
            self.world_size = int(e.get("SLURM_NTASKS", e.get("SLURM_NPROCS", "1")))
            self.local_rank = int(e.get("SLURM_LOCALID", self.rank))
            self.local_world_size = int(e.get("SLURM_NTASKS_PER_NODE", self.world_size))
        else:
            self.rank, self.world_size, self.local_rank, self.local_world_size = 0, 1, 0, 1
            self.launched = False
            self.master_addr, self.master_port = "127.0.0.1", 0
            return
        self.launched = True
        self.master_addr = e.get("MASTER_ADDR", "127.0.0.1")
        self.master_port = int(e.get("MASTER_PORT", "29500"))


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _torch_store(env, timeout):
    """torch's store that every rank of this job can reach, or None."""
    global _store
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        if _store is None:
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            tcp = dist.TCPStore(env.master_addr, env.master_port, env.world_size, False, timedelta(seconds=timeout))
            _store = dist.PrefixStore(f"/worker/attempt_{attempt}", tcp)
        return _store
    return None


def rendezvous_port(env, master_port, purpose, timeout):
    """The port dopt's rank 0 listens on (see the module's docstring)."""
    if master_port:
        return int(master_port)
    if os.environ.get("DOPT_MASTER_PORT"):
        return int(os.environ["DOPT_MASTER_PORT"])
    if not env.launched:
        return _free_port()
    store = _torch_store(env, timeout)
    if store is not None:
        _inits[purpose] += 1
        key = f"dopt/{purpose}/{_inits[purpose]}/port"
        if env.rank == 0:
            port = _free_port()
            store.set(key, str(port))
            return port
        return int(store.get(key))
    return env.master_port + 1


def init_process_group(master_port=None, timeout=300.0, transport="auto"):
    """Joins dopt's world (a collective of every rank) and returns its group.

    Reads the launch environment; ``master_port`` overrides the port choice
    described in the module's docstring; ``transport``: "auto" (shared memory
    on one host, else TCP), "shm" or "tcp"."""
    global _world
    if _world is not None:
        raise _C.StateError("dopt.init_process_group: already initialised (destroy_process_group() first)")
    env = _LaunchEnv()
    port = rendezvous_port(env, master_port, "pg", timeout)
    _world = ProcessGroup(_C.init_process_group(env.rank, env.world_size, env.local_rank, env.local_world_size,
                                                env.master_addr, port, float(timeout), transport))
    return _world


def is_initialized():
    return _world is not None


def get_world():
    """The world group, initialised from the environment on first use."""
    if _world is None:
        init_process_group()
    return _world


def get_rank():
    return get_world().rank()


def get_world_size():
    return get_world().size()


def new_group(ranks):
    return get_world().new_group(ranks)


def new_subgroups(group_size=0):
    return get_world().new_subgroups(group_size)


def destroy_process_group():
    """Forgets the world group (a later call of init_process_group joins a new one)."""
    global _world
    if _world is not None:
        _world.barrier()
    _world = None


def resolve_process_group(process_group):
    """dopt's group for a ``process_group`` argument: None or torch's WORLD -> dopt's world."""
    if process_group is None:
        return get_world()
    if isinstance(process_group, ProcessGroup):
        return process_group
    if isinstance(process_group, _C.ProcessGroup):
        return ProcessGroup(process_group)
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        if process_group is dist.group.WORLD or process_group is dist.distributed_c10d._get_default_group():
            return get_world()
    raise TypeError("dopt: process_group must be None, torch.distributed.group.WORLD or a dopt.ProcessGroup "
                    "(dopt.new_group(ranks)); got " + type(process_group).__name__)


@atexit.register
def _shutdown():
    _C.shutdown()
