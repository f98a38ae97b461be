"""ZeroRedundancyOptimizer for the classes dopt computes: dopt's C++ ZeRO
partitions, steps the shard with dopt's kernels (torch 1.13's arithmetic,
bit for bit) and broadcasts. See dopt.zero for the public class."""
import torch

from . import _C
from ._groups import GroupedOptimizer, resolve_optimizer_class, zero_grads
from .zero import ZeroRedundancyOptimizer


class ShardView:
    """``zero.optim`` of the kernel path: this rank's shard seen as torch's
    local optimizer (``param_groups`` with this rank's parameters and the
    groups' hyperparameters, ``state``, ``defaults``). A view: it is read
    afresh on each access; change hyperparameters through ``zero.param_groups``
    (as with torch, whose ZeRO copies those into the local optimizer at every
    step)."""

    def __init__(self, zero):
        self._zero = zero

    @property
    def param_groups(self):
        """Every group (empty ones too) with this rank's parameters, in the
        order torch's local optimizer holds them (by decreasing size)."""
        z = self._zero
        owners = z._c.param_owners()
        out, i = [], 0
        for g in z.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            mine = [p for j, p in enumerate(g["params"]) if owners[i + j] == z.rank]
            i += len(g["params"])
            d["params"] = sorted(mine, key=lambda t: t.numel(), reverse=True)
            out.append(d)
        return out

    def zero_grad(self, set_to_none=False):
        """Clears the gradients of this rank's parameters, as torch.optim.Optimizer.zero_grad."""
        zero_grads(self.param_groups, set_to_none)

    def load_state_dict(self, state_dict):
        raise _C.NotSupportedError(
            "dopt ZeroRedundancyOptimizer.optim.load_state_dict: the shard's state lives in dopt's C++ ZeRO; load "
            "a global state dict with zero.load_state_dict(...) (each rank keeps the state it owns)")

    @property
    def state(self):
        return self._zero.state

    @property
    def defaults(self):
        return self._zero.defaults

    def state_dict(self):
        """This rank's shard of the state, in torch's local layout."""
        z = self._zero
        groups = self.param_groups
        index, packed = {}, []
        for g in groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = []
            for p in g["params"]:
                index[id(p)] = len(index)
                d["params"].append(index[id(p)])
            packed.append(d)
        state = {index[id(p)]: dict(st) for p, st in z.state.items() if id(p) in index}
        return {"state": state, "param_groups": packed}

    def __repr__(self):
        return f"dopt ZeRO shard of rank {self._zero.rank} ({self._zero._name})"


class KernelZero(GroupedOptimizer, ZeroRedundancyOptimizer):
    """ZeroRedundancyOptimizer over dopt's C++ ZeRO (see the module docstring).
    Named ZeroRedundancyOptimizer in reprs and errors."""

    def _init(self, items, optimizer_class, process_group, parameters_as_bucket_view, overlap_with_ddp, defaults):
        name, torch_cls = resolve_optimizer_class(optimizer_class)
        groups = self._setup(name, torch_cls, items, defaults, "ZeroRedundancyOptimizer")
        # torch's ZeRO keeps only the keyword arguments given as its defaults
        # (the groups hold every hyperparameter); the full set fills new groups.
        self._group_defaults, self.defaults = self.defaults, dict(defaults)
        self._common_init(process_group, parameters_as_bucket_view, overlap_with_ddp)
        self._optim_defaults = dict(defaults)
        c = _C.ZeroRedundancyOptimizer(groups, name, self._dopt_defaults, self._group.c,
                                       self.parameters_as_bucket_view, self._binding.rebind)
        self._after_groups_built(c)
        self.optim = ShardView(self)
        self.initialized = True

    uses_dopt_kernels = True

    # --- torch's attributes ------------------------------------------------------------
    @property
    def rank(self):
        return self._c.rank

    @property
    def world_size(self):
        return self._c.world_size

    @property
    def _all_params(self):
        return [e.param for e in self._binding.entries]

    @property
    def state(self):
        """{parameter: {name: tensor}} of the parameters this rank owns (its
        shard; dopt's state memory seen as torch tensors)."""
        return self._torch_state(self._c.local_state_of)

    # --- torch's methods ---------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """Collective: the local step on this rank's shard, then every
        parameter from its owner. Returns the closure's loss."""
        if kwargs:
            raise TypeError(f"dopt.ZeroRedundancyOptimizer.step: {self._name}.step() takes no keyword arguments "
                            f"besides closure, got {', '.join(sorted(kwargs))}")
        self._notify_join()
        return self._kernel_step(closure)

    @torch.no_grad()
    def step_async(self):
        """Collective, where ``step()`` would be: the local step on this rank's
        shard here, the broadcasts of the updated shards in the background.
        Returns a future (``done()``, ``wait()``, ``result()``; ``wait()``
        releases the GIL and raises a failed broadcast's error): until it is
        done, the parameters this rank does not own may still change, so wait
        before a forward pass or your own writes (docs/zero.md, "step_async").
        Takes no closure."""
        self._notify_join()
        self._push_hyperparams()
        self._binding.sync(f"{self._where}.step_async")
        return self._c.step_async()

    def add_param_group(self, param_group):
        """Collective: every rank adds the same group."""
        self._add_group(param_group, before_add=self._push_hyperparams_upto)

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


KernelZero.__name__ = KernelZero.__qualname__ = "ZeroRedundancyOptimizer"
