"""Where this process's place in the job comes from, and how dopt's ranks
meet (docs/python-ranks.md, "How dopt finds its ranks").

In this order:

1. ``torch.distributed`` is initialised (any init method: env://, tcp://,
   file://, a store, explicit rank and world size, mp.spawn): the rank and
   the world size are torch's, and the ranks meet through torch's store.
2. A launcher's environment (torchrun, dopt-run, mpirun, srun): RANK and
   WORLD_SIZE or their OpenMPI/SLURM forms. The ranks meet through
   torchrun's agent store where there is one, else at MASTER_ADDR on
   MASTER_PORT + 1 (torch keeps MASTER_PORT for itself).
3. Neither: a world of one (a script started alone).

A launcher's variables set only in part (WORLD_SIZE without RANK, say)
are an error that says what is missing, never a silent world of one.

Meeting through a store: every rank writes its host name; rank 0 picks a
free port, an address the others can reach, a job token and (unless
DOPT_SECRET or DOPT_SECRET_FILE is set) a random secret, and writes them
under one key; every rank reads it. dopt's connections then prove that
secret (HMAC challenge, never sent in clear): a process that cannot read
torch's store cannot join or disturb the job.
"""
import json
import os
import secrets
import socket
from datetime import timedelta

from . import _C

_RANK_FAMILIES = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)
_meetings = {}
_agent_store = None


class Launch:
    """This process's rank in the job and how to meet the others.

    ``source`` is "torch" (torch.distributed is initialised), "torchrun",
    "openmpi", "slurm" (a launcher's environment) or "alone". ``store`` is
    a torch store every rank reaches, or None. ``torch_group`` is torch's
    default group when source is "torch"."""

    def __init__(self, source, rank, world_size, local_rank=None, local_world_size=None, store=None,
                 torch_group=None):
        self.source = source
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.store = store
        self.torch_group = torch_group
        self.master_addr = os.environ.get("MASTER_ADDR") or None
        self.master_port = None
        port = os.environ.get("MASTER_PORT")
        if port:
            try:
                self.master_port = int(port)
            except ValueError:
                raise _C.ValueError(f"dopt: MASTER_PORT={port!r} is not a port number") from None

    @property
    def launched(self):
        return self.source != "alone"

    def describe(self):
        where = {"torch": "torch.distributed", "alone": "started alone"}.get(self.source, self.source + "'s variables")
        return f"rank {self.rank} of {self.world_size} ({where})"


def _int_var(name, value):
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise _C.ValueError(f"dopt: {name}={value!r} is not an integer") from None
    if v < 0:
        raise _C.ValueError(f"dopt: {name}={value!r} is negative")
    return v


def torch_world():
    """torch.distributed's default group as a Launch, or None when torch.distributed is not initialised."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = dist.distributed_c10d._get_default_group()
    e = os.environ
    local_rank = local_size = None
    if "LOCAL_RANK" in e and "LOCAL_WORLD_SIZE" in e:
        local_rank, local_size = int(e["LOCAL_RANK"]), int(e["LOCAL_WORLD_SIZE"])
    return Launch("torch", dist.get_rank(), dist.get_world_size(), local_rank, local_size,
                  store=dist.distributed_c10d._get_default_store(), torch_group=group)


def torch_timeout_seconds(group):
    """The timeout torch's group was made with (init_process_group's or new_group's ``timeout=``), or None."""
    try:
        return group.options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return None


def environment_world():
    """The launcher's variables as a Launch; None when none of them is set.
    A family set in part is a ValueError naming what is missing."""
    e = os.environ
    for family, rank_var, size_var, local_rank_var, local_size_var in _RANK_FAMILIES:
        has_rank, has_size = rank_var in e, size_var in e
        if not (has_rank or has_size):
            continue
        if not (has_rank and has_size):
            present, missing = (rank_var, size_var) if has_rank else (size_var, rank_var)
            raise _C.ValueError(
                f"dopt: {present} is set but {missing} is not, so dopt cannot tell this process's rank. "
                f"Start the ranks with a launcher that sets both (torchrun, dopt-run, mpirun, srun), "
                f"or call torch.distributed.init_process_group(...) before using dopt: dopt then takes "
                f"the rank and the world size from torch.distributed")
        rank, size = _int_var(rank_var, e[rank_var]), _int_var(size_var, e[size_var])
        if size < 1 or rank >= size:
            raise _C.ValueError(f"dopt: {rank_var}={rank} is outside [0, {size_var}={size})")
        local_rank = _int_var(local_rank_var, e[local_rank_var]) if local_rank_var in e else None
        local_size = None
        if local_size_var in e and family != "slurm":
            local_size = _int_var(local_size_var, e[local_size_var])
        launch = Launch(family, rank, size, local_rank, local_size)
        if family == "torchrun" and size > 1:
            missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not e.get(v)]
            if missing:
                raise _C.ValueError(
                    f"dopt: {rank_var} and {size_var} are set but {' and '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not, so the ranks have nowhere to meet. Set "
                    "MASTER_ADDR and MASTER_PORT as torch's env:// does (torchrun and dopt-run set them), or call "
                    "torch.distributed.init_process_group(...) before using dopt")
        if family == "torchrun" and e.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            launch.store = _torchrun_agent_store(launch)
        return launch
    return None


def _torchrun_agent_store(launch):
    """torchrun's agent store (its default static rendezvous holds MASTER_PORT with it)."""
    global _agent_store
    if _agent_store is None:
        import torch.distributed as dist
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        tcp = dist.TCPStore(launch.master_addr or "127.0.0.1", launch.master_port or 29500, launch.world_size,
                            False, timedelta(seconds=300))
        _agent_store = dist.PrefixStore(f"/worker/attempt_{attempt}", tcp)
    return _agent_store


def current():
    """This process's Launch: torch.distributed's world, else the launcher's variables, else a world of one."""
    return torch_world() or environment_world() or Launch("alone", 0, 1, 0, 1)


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class Meeting:
    """Where rank 0 listens for one rendezvous of dopt's, and what the ranks share."""

    def __init__(self, addr, port, local_rank, local_world_size, job_id="", secret=""):
        self.addr, self.port = addr, int(port)
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.job_id, self.secret = job_id, secret


def _wanted_secret():
    """Whether dopt should make a secret (the environment sets none)."""
    return not (os.environ.get("DOPT_SECRET") or os.environ.get("DOPT_SECRET_FILE"))


def _store_get(store, key, timeout, what):
    """store.get bounded by ``timeout`` seconds (torch's store would wait its own, 30 min by default)."""
    try:
        store.wait([key], timedelta(seconds=timeout))
    except RuntimeError as e:
        raise _C.TimeoutError(f"dopt: {what} did not arrive in torch's store within {timeout:.0f} s (key '{key}'): "
                              "does every rank of the group call the same dopt constructors and collectives in the "
                              f"same order? ({e})") from None
    return store.get(key).decode()


def meet(launch, purpose, ranks=None, master_port=None, timeout=300.0):
    """How the ranks of ``launch`` (or the ``ranks`` of its world, given in
    group order) meet for ``purpose``: through the store when there is one.

    Every participating rank calls it, in the same order for the same
    purpose; a rank that does not come within ``timeout`` seconds is a
    dopt.TimeoutError on the others."""
    members = list(range(launch.world_size)) if ranks is None else list(ranks)
    me = members.index(launch.rank)
    n = len(members)
    if ranks is None and (master_port or os.environ.get("DOPT_MASTER_PORT")):
        port = int(master_port or os.environ["DOPT_MASTER_PORT"])
        return Meeting(launch.master_addr or "127.0.0.1", port, *_local_from(launch, me, n))
    if not launch.launched:  # nobody else will come: a key of its own, so nothing stays open
        return Meeting("127.0.0.1", _free_port(), 0, 1, "alone-" + secrets.token_hex(8),
                       secrets.token_hex(32) if _wanted_secret() else "")
    if launch.store is None:
        if ranks is not None:
            raise _C.NotSupportedError(
                f"dopt: a group of ranks {members} needs a store to meet (torch.distributed initialised, "
                "or torchrun's agent store); this job has none")
        return Meeting(launch.master_addr or "127.0.0.1", (launch.master_port or 29500) + 1,
                       *_local_from(launch, me, n))
    count = _meetings.get(purpose, 0) + 1
    _meetings[purpose] = count
    base = f"dopt/{purpose}/{count}/"
    store = launch.store
    host = socket.gethostname()
    store.set(base + f"host/{me}", host)
    if me == 0:
        hosts = [host] + [_store_get(store, base + f"host/{r}", timeout, f"rank {members[r]} (for {purpose})")
                          for r in range(1, n)]
        if launch.master_addr and ranks is None:
            addr = launch.master_addr
        elif all(h == host for h in hosts):
            addr = "127.0.0.1"
        else:
            addr = socket.getfqdn()
        plan = {"addr": addr, "port": _free_port(), "hosts": hosts, "job": "torch-" + secrets.token_hex(8),
                "secret": secrets.token_hex(32) if _wanted_secret() else ""}
        store.set(base + "plan", json.dumps(plan))
    else:
        plan = json.loads(_store_get(store, base + "plan", timeout, f"rank {members[0]}'s plan (for {purpose})"))
    hosts = plan["hosts"]
    if launch.local_rank is not None and launch.local_world_size is not None and ranks is None:
        local_rank, local_size = launch.local_rank, launch.local_world_size
    else:
        local_rank = sum(1 for h in hosts[:me] if h == hosts[me])
        local_size = sum(1 for h in hosts if h == hosts[me])
    return Meeting(plan["addr"], plan["port"], local_rank, local_size, plan["job"], plan["secret"])


def _local_from(launch, me, n):
    if launch.local_rank is not None and launch.local_world_size is not None:
        return launch.local_rank, launch.local_world_size
    return me, n
