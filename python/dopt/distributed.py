"""dopt's process groups in Python.

dopt's world is the job's: torch.distributed's when it is initialised (any
init method, mp.spawn included), else the launcher's (torchrun, dopt-run,
mpirun, srun), else a world of one. ``dopt._launch`` says how the ranks
find each other; dopt's rendezvous never takes torch's MASTER_PORT.

``process_group=`` arguments take None (the world), torch's WORLD, any
torch ProcessGroup (``dist.new_group(ranks)``: dopt makes a group of the
same ranks, among those ranks only) or a dopt.ProcessGroup.
"""
import atexit

from . import _C
from . import _launch
from ._tensor import to_dopt

__all__ = ["ProcessGroup", "init_process_group", "is_initialized", "get_world", "get_rank", "get_world_size",
           "new_group", "new_subgroups", "destroy_process_group"]

_world = None
_world_torch_group = None   # torch's default group the world was made from (None: not from torch)
_world_alone = False        # the world is this process alone (no launcher, torch.distributed not initialised)
_torch_groups = {}          # torch ProcessGroup -> dopt ProcessGroup of the same ranks


class ProcessGroup:
    """A dopt process group (collectives on torch tensors, zero-copy)."""

    def __init__(self, c, global_ranks=None, torch_group=None):
        self.c = c
        # A group made for a torch subgroup is a dopt world of its members:
        # its ranks in torch's numbering.
        self._global_ranks = None if global_ranks is None else list(global_ranks)
        self.torch_group = torch_group

    def rank(self):
        return self.c.rank()

    def size(self):
        return self.c.size()

    def is_member(self):
        return self.c.is_member()

    @property
    def ranks(self):
        """The members' global ranks, in group order."""
        if self._global_ranks is not None:
            return list(self._global_ranks)
        return list(self.c.ranks)

    def global_rank(self, group_rank):
        if self._global_ranks is not None:
            return self._global_ranks[group_rank]
        return self.c.global_rank(group_rank)

    def group_rank(self, global_rank):
        if self._global_ranks is not None:
            return self._global_ranks.index(global_rank) if global_rank in self._global_ranks else -1
        return self.c.group_rank(global_rank)

    def timeout(self):
        """How long this rank's calls on the group wait for the others, in seconds."""
        return self.c.timeout()

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
        if self._global_ranks is not None:
            raise _C.StateError("dopt.ProcessGroup.new_group: call it on the world group (dopt.get_world()), "
                                "not on a group made for a torch subgroup")
        return ProcessGroup(self.c.new_group(sorted(ranks)))

    def new_subgroups(self, group_size=0):
        cur, all_groups = self.c.new_subgroups(group_size)
        return ProcessGroup(cur), [ProcessGroup(g) for g in all_groups]

    def __repr__(self):
        return f"dopt.ProcessGroup(ranks={self.ranks}, rank={self.rank()})"


def _join(launch, meeting, timeout, transport, ranks=None):
    """The dopt world of ``launch`` (or of its ``ranks``): a collective of those ranks."""
    rank = launch.rank if ranks is None else ranks.index(launch.rank)
    size = launch.world_size if ranks is None else len(ranks)
    return _C.init_process_group(rank, size, meeting.local_rank, meeting.local_world_size, meeting.addr,
                                 meeting.port, float(timeout), transport, meeting.job_id, meeting.secret)


def init_process_group(master_port=None, timeout=300.0, transport="auto"):
    """Joins dopt's world (a collective of every rank) and returns its group.

    The world is torch.distributed's when it is initialised, else the
    launcher's (see the module's docstring). ``master_port`` fixes the port
    of dopt's rendezvous (else one rank 0 picks and shares through torch's
    store, or MASTER_PORT + 1); ``transport``: "auto" (shared memory on one
    host, else TCP), "shm" or "tcp"."""
    global _world, _world_torch_group, _world_alone
    if _world is not None:
        raise _C.StateError("dopt.init_process_group: already initialised (destroy_process_group() first)")
    launch = _launch.current()
    meeting = _launch.meet(launch, "pg", master_port=master_port, timeout=timeout)
    _world = ProcessGroup(_join(launch, meeting, timeout, transport))
    _world_torch_group = launch.torch_group
    _follow_torch_timeout(_world, launch.torch_group)
    _world_alone = not launch.launched
    if _world_alone:
        import warnings
        warnings.warn("dopt: no launcher variables (RANK, WORLD_SIZE, ...) and torch.distributed is not "
                      "initialised, so dopt's world is this process alone (a world of one). Under mp.spawn or "
                      "several processes, call torch.distributed.init_process_group(...) before using dopt; "
                      "dopt then follows torch's world.", stacklevel=_user_stacklevel())
    return _world


def _user_stacklevel():
    """warnings.warn's stacklevel of the first caller outside the dopt package."""
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame, level = frame.f_back, level + 1
    return level


def _follow_torch_timeout(group, torch_group):
    """A group made from a torch group waits as long as torch's does
    (init_process_group's / new_group's ``timeout=``, 30 min by default),
    unless DOPT_TIMEOUT_MS sets dopt's own."""
    import os
    if torch_group is None or os.environ.get("DOPT_TIMEOUT_MS"):
        return
    seconds = _launch.torch_timeout_seconds(torch_group)
    if seconds:
        group.set_timeout(seconds)


def is_initialized():
    return _world is not None


def get_world():
    """The world group, made on first use (see init_process_group). When
    torch.distributed was initialised anew since (destroy_process_group,
    then init_process_group), dopt's world follows it."""
    global _world
    if _world is not None and (_world_torch_group is not None or _world_alone):
        current = _launch.torch_world()
        if (current is None and _world_torch_group is not None) or (
                current is not None and current.torch_group is not _world_torch_group):
            _world = None
            _torch_groups.clear()
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
    _torch_groups.clear()


def _torch_group_ranks(group):
    """torch's global ranks of a torch ProcessGroup, in group-rank order."""
    import torch.distributed as dist
    mapping = dist.distributed_c10d._pg_group_ranks.get(group)
    if mapping is None:
        raise _C.ValueError("dopt: the torch process group given is not one of this process's torch.distributed "
                            "groups (made by dist.new_group after dist.init_process_group?)")
    return sorted(mapping, key=mapping.get)


def _for_torch_group(group, where):
    """The dopt group of a torch subgroup's ranks (made on first use, among its members only)."""
    hit = _torch_groups.get(group)
    if hit is not None:
        return hit
    import torch.distributed as dist
    ranks = _torch_group_ranks(group)
    launch = _launch.torch_world()
    if launch is None or launch.rank not in ranks:
        raise _C.ValueError(f"dopt {where}: this rank ({dist.get_rank()}) is not a member of the process group "
                            f"given (ranks {ranks}); only its members may use it")
    if ranks == list(range(launch.world_size)):
        out = get_world()  # every rank is a member: the world's collective is theirs
    else:
        name = dist.distributed_c10d._pg_names.get(group, "?")
        meeting = _launch.meet(launch, "group-" + name, ranks=ranks)
        out = ProcessGroup(_join(launch, meeting, 300.0, "auto", ranks=ranks), global_ranks=ranks,
                           torch_group=group)
        _follow_torch_timeout(out, group)
    _torch_groups[group] = out
    return out


class NotAMember(_C.ValueError):
    """A rank passed the placeholder torch gives the ranks outside a group."""


def resolve_process_group(process_group, where="process_group"):
    """dopt's group for a ``process_group`` argument: None or torch's WORLD ->
    dopt's world; another torch ProcessGroup -> a dopt group of its ranks;
    a dopt group -> itself. ``where`` names the user's call in errors."""
    if process_group is None:
        return get_world()
    if isinstance(process_group, ProcessGroup):
        return process_group
    if isinstance(process_group, _C.ProcessGroup):
        return ProcessGroup(process_group)
    import torch.distributed as dist
    if dist.is_available() and process_group is dist.GroupMember.NON_GROUP_MEMBER:
        raise NotAMember(f"dopt {where}: this rank ({dist.get_rank()}) is not a member of the process group given "
                         "(torch gives the ranks outside dist.new_group(ranks) a placeholder); only its members "
                         "may use it")
    if dist.is_available() and isinstance(process_group, dist.ProcessGroup):
        if not dist.is_initialized():
            raise _C.StateError(f"dopt {where}: a torch process group was given but torch.distributed is not "
                                "initialised")
        if process_group is dist.group.WORLD or process_group is dist.distributed_c10d._get_default_group():
            return get_world()
        return _for_torch_group(process_group, where)
    raise TypeError(f"dopt {where}: process_group must be None, a torch.distributed ProcessGroup "
                    "(dist.group.WORLD, dist.new_group(ranks)) or a dopt.ProcessGroup; got "
                    + type(process_group).__name__)


def torch_group_of(group):
    """The torch ProcessGroup for a dopt group, for torch's own calls (Join):
    torch's WORLD for dopt's world, the torch subgroup it was made for, or
    None when torch.distributed is not initialised."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if group.torch_group is not None:
        return group.torch_group
    if group is _world:
        return dist.group.WORLD
    return None


@atexit.register
def _shutdown():
    _C.shutdown()
