"""RPC over dopt's actors, for DistributedOptimizer: workers, remote calls of
Python functions, remote references to tensors and gradient contexts.

torch.distributed.rpc's calls with dopt's transport::

    dopt.rpc.init_rpc("trainer", rank=0, world_size=3)
    w = dopt.rpc.remote("ps1", torch.randn, args=(4, 4))     # RRef to a tensor kept on ps1
    y = dopt.rpc.rpc_sync("ps1", mymodule.f, args=(x,))       # any picklable result
    with dopt.rpc.context() as ctx:                          # torch: dist_autograd.context()
        ctx.deposit(w, grad_of_w)                            # torch: dist_autograd.backward
        opt.step(ctx)                                        # DistributedOptimizer
    dopt.rpc.shutdown()

Functions travel by name (module and qualified name, as pickle names them):
every worker must be able to import them. Arguments and results are
pickled. ``remote`` keeps a tensor on the owner: the function must return a
torch tensor, and the owner's dopt value shares that tensor's memory.
There is no distributed autograd engine: gradients of remote parameters
are deposited into a context explicitly (``GradContext.deposit``).
"""
import contextlib
import importlib
import pickle

import torch

from . import _C
from ._tensor import to_dopt, to_torch
from . import _launch

__all__ = ["init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "RRef", "context", "GradContext",
           "get_worker_info", "WorkerInfo"]

WorkerInfo = _C.rpc.WorkerInfo
_agent = None


def _require_agent(op):
    if _agent is None:
        raise _C.StateError(f"dopt.rpc.{op}: call dopt.rpc.init_rpc first")
    return _agent


def init_rpc(name, rank=None, world_size=None, master_port=None, rpc_timeout=60.0, num_worker_threads=16,
             timeout=300.0):
    """Joins the RPC world as worker ``name`` (a collective of every worker).
    rank / world_size default to the launch environment; the rendezvous port
    follows the rules of dopt.distributed (never MASTER_PORT itself)."""
    global _agent
    if _agent is not None:
        raise _C.StateError("dopt.rpc.init_rpc: already initialised")
    launch = _launch.current()
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise _C.ValueError("dopt.rpc.init_rpc: give both rank and world_size, or neither (then they come "
                                "from torch.distributed or the launcher)")
        if launch.launched and (int(rank), int(world_size)) != (launch.rank, launch.world_size):
            launch = _launch.Launch("given", rank, world_size)
        else:
            launch.rank, launch.world_size = int(rank), int(world_size)
            if not launch.launched:
                launch.source = "given"
    meeting = _launch.meet(launch, "rpc", master_port=master_port)
    _agent = _C.rpc.init(name, launch.rank, launch.world_size, meeting.addr, meeting.port, float(rpc_timeout),
                         int(num_worker_threads))
    return _agent


def shutdown(graceful=True):
    """Graceful and collective: waits for every worker's outstanding work."""
    global _agent
    if _agent is not None:
        if graceful:
            _agent.shutdown()
        _agent = None


def get_worker_info(worker_name=None):
    a = _require_agent("get_worker_info")
    return a.worker_info() if worker_name is None else a.worker_info_of(worker_name)


def _name_of(func):
    mod = getattr(func, "__module__", None)
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if mod is None and isinstance(func, type(torch.randn)):
        mod = "torch"
    if not mod or not qual or "<locals>" in qual or "<lambda>" in qual:
        raise TypeError(f"dopt.rpc: {func!r} cannot be called remotely; pass a module-level function "
                        "(it travels by name)")
    if mod == "torch._C._VariableFunctions":
        mod = "torch"
    return mod, qual


def _resolve(mod, qual):
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _run(mod, qual, payload):
    args, kwargs = pickle.loads(payload)
    return _resolve(mod, qual)(*args, **(kwargs or {}))


def _run_pickled(mod, qual, payload):
    return pickle.dumps(_run(mod, qual, payload))


def _run_for_tensor(mod, qual, payload):
    out = _run(mod, qual, payload)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"dopt.rpc.remote: {mod}.{qual} returned {type(out).__name__}, not a torch.Tensor")
    from torch.utils import dlpack
    return dlpack.to_dlpack(out.detach())


def _payload(args, kwargs):
    return pickle.dumps((tuple(args or ()), dict(kwargs or {})))


class Future:
    """The result of rpc_async: ``wait()`` returns it (or raises the remote error)."""

    def __init__(self, c):
        self._c = c

    def wait(self):
        return pickle.loads(self._c.wait())

    def done(self):
        return self._c.done()


def rpc_async(to, func, args=None, kwargs=None, timeout=-1.0):
    mod, qual = _name_of(func)
    return Future(_require_agent("rpc_async").call_async(to, mod, qual, _payload(args, kwargs),
                                                       float(timeout) if timeout and timeout > 0 else 0.0))


def rpc_sync(to, func, args=None, kwargs=None, timeout=-1.0):
    return rpc_async(to, func, args, kwargs, timeout).wait()


class RRef:
    """A reference to a tensor owned by one worker. ``RRef(tensor)`` makes one
    owned here (sharing the tensor's memory); ``remote()`` returns one owned
    elsewhere."""

    def __init__(self, value=None, _c=None):
        if _c is None:
            if not isinstance(value, torch.Tensor):
                raise TypeError("dopt.rpc.RRef holds torch tensors")
            _c = _require_agent("RRef").make_rref(to_dopt(value, requires_grad=False))
        self._c = _c

    def owner(self):
        return self._c.owner()

    def owner_name(self):
        return self._c.owner().name

    def is_owner(self):
        return self._c.is_owner()

    def to_here(self, timeout=0.0):
        """A copy of the value (fetched after every call the owner received before)."""
        return to_torch(self._c.to_here(float(timeout)))

    def local_value(self):
        """The value itself, sharing memory (owner only)."""
        return to_torch(self._c.local_value())

    def __repr__(self):
        return f"dopt.rpc.RRef(owner={self.owner_name()}, id={self._c.id})"


def remote(to, func, args=None, kwargs=None, timeout=-1.0):
    """Runs func(*args, **kwargs) on ``to`` and keeps its result (a torch tensor) there."""
    mod, qual = _name_of(func)
    return RRef(_c=_require_agent("remote").remote_tensor(to, mod, qual, _payload(args, kwargs),
                                                         float(timeout) if timeout and timeout > 0 else 0.0))


class GradContext:
    """Gradients for remote parameters, kept on their owners (torch's
    dist_autograd context, as an explicit handle)."""

    def __init__(self, c):
        self._c = c

    @property
    def id(self):
        return self._c.id

    def deposit(self, rref, grad):
        """Adds ``grad`` to the context's gradient of ``rref`` on its owner."""
        self._c.deposit(rref._c, to_dopt(grad.detach().contiguous(), requires_grad=False))

    def deposit_all(self, pairs):
        self._c.deposit_all([(r._c, to_dopt(g.detach().contiguous(), requires_grad=False)) for r, g in pairs])

    def wait_deposits(self):
        self._c.wait_deposits()

    def release(self):
        self._c.release()


@contextlib.contextmanager
def context():
    """``with dopt.rpc.context() as ctx:`` a gradient context, released at the end."""
    ctx = GradContext(_require_agent("context").new_context())
    try:
        yield ctx
    finally:
        ctx.release()
