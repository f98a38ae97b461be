"""as_functional_optim: torch.distributed.optim.as_functional_optim, computed by dopt."""
import torch

from . import _C
from ._groups import bind_arguments, resolve_optimizer_class, split_hyperparams
from ._tensor import to_dopt, to_torch

__all__ = ["FunctionalOptimizer", "as_functional_optim"]


class FunctionalOptimizer:
    """torch's _FunctionalAdam & co.: one set of hyperparameters, no param
    groups; ``step_param(param, grad)`` updates one torch tensor in place,
    ``step(gradients)`` the parameters given at construction. The state is
    kept per tensor object (dopt's, shown as torch tensors by ``state``)."""

    def __init__(self, name, params, hyperparameters):
        self._params = list(params)
        self._dts = {}
        for p in self._params:
            self._dopt(p)
        self._c = _C.make_functional(name, [self._dts[id(p)][1] for p in self._params], hyperparameters,
                                     allow_empty_param_list=True)
        self.defaults = dict(hyperparameters)

    def _dopt(self, p):
        hit = self._dts.get(id(p))
        if hit is None or hit[0] is not p:
            hit = (p, to_dopt(p, requires_grad=False))
            self._dts[id(p)] = hit
        return hit[1]

    @torch.no_grad()
    def step_param(self, param, grad):
        self._c.step_param(self._dopt(param), None if grad is None else to_dopt(grad, requires_grad=False))

    @torch.no_grad()
    def step(self, gradients):
        if len(gradients) != len(self._params):
            raise _C.ValueError("the gradients passed in does not equal to the size of the parameters!"
                                f"Params length: {len(self._params)}. Gradients length: {len(gradients)}")
        self._c.step([None if g is None else to_dopt(g, requires_grad=False) for g in gradients])

    @property
    def state(self):
        out = {}
        for p, dt in self._dts.values():
            st = self._c.state_of(dt)
            if st:
                out[p] = {k: to_torch(v) for k, v in st.items()}
        return out

    @property
    def name(self):
        return self._c.name


def as_functional_optim(optim_cls, *args, **kwargs):
    """The functional form of ``optim_cls`` (torch.optim.Adam, a dopt.optim
    class or a name) without parameters, for ``step_param``."""
    name, torch_cls = resolve_optimizer_class(optim_cls)
    hp = bind_arguments(name, torch_cls, args, kwargs)
    ours, _ = split_hyperparams(name, torch_cls, hp, "as_functional_optim")
    return FunctionalOptimizer(name, [], ours)
