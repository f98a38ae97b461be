"""dopt.ZeroRedundancyOptimizer: torch.distributed.optim.ZeroRedundancyOptimizer
computed by dopt (same constructor, methods and state-dict layout)."""
import torch

from . import _C
from ._groups import GroupedOptimizer, normalise_group, resolve_optimizer_class
from .distributed import resolve_process_group

__all__ = ["ZeroRedundancyOptimizer"]


class ZeroRedundancyOptimizer(GroupedOptimizer):
    r"""ZeRO stage 1 over a dopt process group, a drop-in for torch's.

    ``ZeroRedundancyOptimizer(params, optimizer_class, process_group=None,
    parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults)``:
    ``optimizer_class`` is ``torch.optim.Adam`` (any of dopt's eight classes,
    given as the torch class, the dopt.optim class or the name);
    ``process_group`` is None (dopt's world, initialised from the launcher's
    environment on first use) or a dopt process group. The constructor,
    ``step()``, ``add_param_group()`` and ``consolidate_state_dict()`` are
    collectives over the group, as in torch.

    The torch parameters stay the parameters: dopt updates their memory in
    place, and with ``parameters_as_bucket_view=True`` each one becomes a view
    of dopt's bucket (torch does ``p.data = bucket_view`` too), so the model
    always holds the updated values. Gradients are read from ``p.grad`` at
    each ``step()`` (averaged by DDP or by you, as with torch's).

    ``state_dict()`` (after ``consolidate_state_dict(to)``, on rank ``to``)
    is torch's global layout and loads into torch's ZeroRedundancyOptimizer
    or a plain torch.optim optimizer; ``load_state_dict()`` takes what those
    save.
    """

    def __init__(self, params, optimizer_class, process_group=None, parameters_as_bucket_view=False,
                 overlap_with_ddp=False, **defaults):
        if overlap_with_ddp:
            raise _C.NotSupportedError(
                "dopt.ZeroRedundancyOptimizer: overlap_with_ddp=True is not available in the Python package "
                "(it needs DDP's comm hook driving dopt's optimizer); use overlap_with_ddp=False")
        name, torch_cls = resolve_optimizer_class(optimizer_class)
        groups = self._setup(name, torch_cls, params, defaults, "ZeroRedundancyOptimizer")
        self._group = resolve_process_group(process_group)
        self.parameters_as_bucket_view = bool(parameters_as_bucket_view)
        self._overlap_with_ddp = False
        self._optim_defaults = dict(defaults)
        c = _C.ZeroRedundancyOptimizer(groups, name, self._dopt_defaults, self._group.c,
                                       self.parameters_as_bucket_view, self._binding.rebind)
        self._after_groups_built(c)
        self.initialized = True

    # --- torch's attributes ------------------------------------------------------------
    @property
    def rank(self):
        return self._c.rank

    @property
    def world_size(self):
        return self._c.world_size

    @property
    def global_rank(self):
        return self._group.global_rank(self._c.rank)

    @property
    def process_group(self):
        return self._group

    @property
    def state(self):
        """{parameter: {name: tensor}} of the parameters this rank owns (its
        shard; dopt tensors' memory seen as torch tensors)."""
        from ._tensor import to_torch
        out = {}
        for e in self._binding.entries:
            st = self._c.local_state_of(e.dt)
            if st:
                out[e.param] = {k: to_torch(v) for k, v in st.items()}
        return out

    # --- torch's methods ---------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """Collective: the local step on this rank's shard, then every
        parameter from its owner. Returns the closure's loss."""
        if kwargs:
            raise TypeError("dopt.ZeroRedundancyOptimizer.step takes no keyword arguments besides closure")
        loss = self._closure_loss(closure)
        self._push_hyperparams()
        self._binding.sync()
        self._c.step()
        return loss

    def add_param_group(self, param_group):
        """Collective: every rank adds the same group."""
        n_params, n_groups = len(self._binding.entries), len(self.param_groups)
        try:
            dts, overrides = self._prepare_group(normalise_group(param_group))
            self._push_hyperparams_upto(n_groups)
            self._c.add_param_group(dts, overrides)
        except BaseException:
            self._binding.truncate(n_params)
            del self.param_groups[n_groups:]
            del self._synced[n_groups:]
            raise
        hp = self._c.group_hyperparams(n_groups)
        self.param_groups[-1].update(hp)
        self._synced[-1] = dict(hp)

    def _push_hyperparams_upto(self, n):
        saved = self.param_groups, self._synced
        self.param_groups, self._synced = saved[0][:n], saved[1][:n]
        try:
            self._push_hyperparams()
        finally:
            self.param_groups, self._synced = saved

    def consolidate_state_dict(self, to: int = 0):
        """Collective: gathers every rank's shard of the state on rank ``to``."""
        self._push_hyperparams()
        self._c.consolidate_state_dict(to)

    def state_dict(self):
        """torch's global layout; only on the rank of the last
        consolidate_state_dict (RuntimeError elsewhere, as torch)."""
        return self._torch_layout(self._c.state_dict())

    def load_state_dict(self, state_dict):
        """Loads a global state dict (torch's ZeRO's, a plain optimizer's, or
        this class's): each rank keeps the state of the parameters it owns."""
        self._c.load_state_dict(self._dopt_layout(state_dict))
        self._adopt_groups(state_dict)

    # --- dopt's additions --------------------------------------------------------------
    def save_sharded(self, directory):
        """Collective: one checkpoint file per rank (reloads at any world size)."""
        self._push_hyperparams()
        self._c.save_sharded(str(directory))

    def load_sharded(self, directory):
        report = self._c.load_sharded(str(directory))
        self._pull_hyperparams()
        return report

    def param_owners(self):
        """The owner rank of each parameter, by position in the groups."""
        return list(self._c.param_owners())

    @property
    def local_state_bytes(self):
        return self._c.local_state_bytes
