"""dopt.ZeroRedundancyOptimizer: torch.distributed.optim.ZeroRedundancyOptimizer
computed by dopt (same constructor, methods, attributes and state-dict layout).

Two ways to step a shard, one class (docs/python.md, "Which optimizer classes"):

* the classes dopt computes (torch.optim's SGD, Adam, AdamW, Adagrad,
  RMSprop, Adamax, Adadelta, Rprop, or dopt.optim's): dopt's C++ kernels step
  the shard and dopt's C++ ZeRO partitions and broadcasts (``_zero_kernels``);
* any other ``torch.optim.Optimizer`` class (your own, a third-party one, a
  subclass of torch's, or torch's with options dopt does not compute such as
  ``foreach=True``): that class steps the shard, dopt partitions, broadcasts,
  joins and consolidates (``_zero_torch_step``).

``uses_dopt_kernels`` says which one an instance took.
"""
import torch
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from . import _C
from ._groups import kernels_compute, refuse_duplicates
from .distributed import resolve_process_group, torch_group_of

__all__ = ["ZeroRedundancyOptimizer"]


class _ZeroJoinHook(JoinHook):
    """torch's Join: a rank that ran out of inputs shadows the others' steps.

    The shadow step does not notify the join context: when ZeRO is the first
    joinable, torch's own hook does, and so posts one all-reduce more than
    the ranks still training, which deadlocks (torch-differences.md)."""

    def __init__(self, zero):
        self.zero = zero
        super().__init__()

    def main_hook(self):
        self.zero._shadowing = True
        try:
            self.zero.step()
        finally:
            self.zero._shadowing = False


def _check_params_argument(params):
    """torch's checks of ``params`` (TypeError / ValueError), before anything
    else; the parameters or groups as a list (a generator is read once)."""
    if isinstance(params, torch.Tensor):
        raise TypeError(f"`params` argument should be an iterable of Tensors, but got {torch.typename(params)}")
    try:
        items = list(params)
    except TypeError:
        raise TypeError("`params` argument should be an iterable of Tensors or dicts, but got "
                        + torch.typename(params)) from None
    if len(items) == 0:
        raise _C.ValueError("ZeroRedundancyOptimizer got an empty parameter list")
    if all(isinstance(p, dict) for p in items):
        for g in items:
            if "params" not in g:
                raise _C.ValueError("Each parameter group passed-in via `params` must have a 'params' key "
                                    "mapping to the parameters in the group")
        for g in items:
            if isinstance(g["params"], set):
                raise TypeError("optimizer parameters need to be organized in ordered collections, but the "
                                "ordering of tensors in sets will change between runs. Please use a list instead.")
        items = [dict(g, params=[g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"]))
                 for g in items]
        tensors = [t for g in items for t in g["params"]]
    elif all(isinstance(p, torch.Tensor) for p in items):
        tensors = items
    else:
        raise TypeError("`params` argument should be an iterable of Tensors or dicts")
    refuse_duplicates(tensors, "ZeroRedundancyOptimizer")
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout != torch.strided:
            raise _C.ValueError("ZeroRedundancyOptimizer only supports dense parameters, got one with layout "
                                f"{t.layout} ({torch.typename(t)})")
    return items


_ways = {}


def _with_way(user_class, way):
    """A user's subclass of ZeroRedundancyOptimizer on top of one way."""
    key = (user_class, way)
    if key not in _ways:
        _ways[key] = type(user_class.__name__, (user_class, way), {"__module__": user_class.__module__})
    return _ways[key]


class ZeroRedundancyOptimizer(torch.optim.Optimizer, Joinable):
    r"""ZeRO stage 1 over a process group, a drop-in for torch's.

    ``ZeroRedundancyOptimizer(params, optimizer_class, process_group=None,
    parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults)``:

    * ``optimizer_class``: any ``torch.optim.Optimizer`` class (or a dopt.optim
      class, or the name of one dopt computes);
    * ``process_group``: None (the world: torch.distributed's when it is
      initialised, else the launcher's), any torch ProcessGroup
      (``dist.group.WORLD``, ``dist.new_group(ranks)``) or a dopt group.

    The constructor, ``step()``, ``add_param_group()`` and
    ``consolidate_state_dict()`` are collectives over the group, called by
    every member in the same order, as in torch. ``optim`` is this rank's
    local optimizer (its shard), ``state_dict()`` (after
    ``consolidate_state_dict(to)``, on rank ``to``) torch's global layout.
    With torch's ``Join`` (``join_hook``, ``join_device``,
    ``join_process_group``), ranks with fewer inputs shadow the others' steps.
    """

    def __init__(self, params, optimizer_class, process_group=None, parameters_as_bucket_view=False,
                 overlap_with_ddp=False, **defaults):
        items = _check_params_argument(params)
        from ._zero_kernels import KernelZero
        from ._zero_torch_step import TorchStepZero
        way = KernelZero if kernels_compute(optimizer_class, defaults, items) else TorchStepZero
        if not isinstance(self, way):
            self.__class__ = way if type(self) is ZeroRedundancyOptimizer else _with_way(type(self), way)
        self._init(items, optimizer_class, process_group, parameters_as_bucket_view, overlap_with_ddp, defaults)

    def _common_init(self, process_group, parameters_as_bucket_view, overlap_with_ddp):
        """What both ways share: the groups, Join's configuration, the flags."""
        if overlap_with_ddp:
            raise _C.NotSupportedError(
                "dopt.ZeroRedundancyOptimizer: overlap_with_ddp=True is not available in the Python package "
                "(it needs DDP's comm hook driving dopt's optimizer); use overlap_with_ddp=False")
        Joinable.__init__(self)
        self._group = resolve_process_group(process_group, "ZeroRedundancyOptimizer")
        self._torch_group = process_group if process_group is not None else torch_group_of(self._group)
        self.parameters_as_bucket_view = bool(parameters_as_bucket_view)
        self._overlap_with_ddp = False

    # --- torch's attributes ------------------------------------------------------------
    @property
    def process_group(self):
        """The group given (torch's WORLD for None when torch.distributed is initialised)."""
        return self._torch_group if self._torch_group is not None else self._group

    @property
    def dopt_group(self):
        """dopt only: the dopt group the collectives run on."""
        return self._group

    @property
    def global_rank(self):
        return self._group.global_rank(self.rank)

    # --- torch's Join ------------------------------------------------------------------
    def join_hook(self, **kwargs):
        """The hook torch's ``Join`` runs on a rank that joined early: it
        shadows the others' ``step()`` (set the gradients before, as with
        torch's)."""
        return _ZeroJoinHook(self)

    @property
    def join_device(self):
        return self._all_params[0].device

    @property
    def join_process_group(self):
        return self._torch_group if self._torch_group is not None else self._group

    _shadowing = False

    def step_async(self):
        """dopt's ZeRO step_async (the broadcasts in the background) runs on
        dopt's kernels only (``uses_dopt_kernels``); the kernel class overrides this."""
        raise _C.NotSupportedError(f"dopt.ZeroRedundancyOptimizer.step_async: {type(self).__name__} steps its shard "
                                   "with a Python optimizer class; step_async needs a class dopt computes "
                                   "(uses_dopt_kernels); call step()")

    def _notify_join(self):
        if not self._shadowing:
            Join.notify_join_context(self)

    def __getstate__(self):
        raise TypeError(f"{type(self).__name__} cannot be pickled; save its state_dict()")
