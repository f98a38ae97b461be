"""dopt's local optimizers with torch.optim's constructors and methods.

``dopt.optim.Adam(model.parameters(), lr=1e-3)`` steps the torch parameters
in place (dopt shares their memory) with torch 1.13's single-tensor
arithmetic, bit for bit. Every class of ``dopt.registered_optimizers()`` is
here under its torch name: SGD, Adam, AdamW, Adagrad, RMSprop, Adamax,
Adadelta, Rprop.
"""
import torch

from . import _C
from ._groups import (GroupedOptimizer, bind_arguments, registered_optimizers,
                      resolve_optimizer_class)

__all__ = ["Optimizer", "from_torch"]


class Optimizer(GroupedOptimizer):
    """Base of dopt's local optimizers (a torch.optim.Optimizer, so LR
    schedulers accept it). ``state``, ``state_dict()``, ``load_state_dict()``,
    ``add_param_group()``, ``zero_grad()`` and ``step(closure)`` behave as
    torch's; the optimizer state lives in dopt, ``state`` shows it as torch
    tensors sharing its memory."""

    _dopt_name = None

    def __init__(self, params, *args, **kwargs):
        name, torch_cls = resolve_optimizer_class(self._dopt_name)
        hp = bind_arguments(name, torch_cls, args, kwargs)
        groups = self._setup(name, torch_cls, params, hp, name)
        self._after_groups_built(_C.make_optimizer(name, groups, self._dopt_defaults))

    @torch.no_grad()
    def step(self, closure=None):
        return self._kernel_step(closure)

    def add_param_group(self, param_group):
        self._add_group(param_group)

    @property
    def state(self):
        """{parameter: {name: tensor}}: the dopt state, as torch tensors over its memory."""
        return self._torch_state(self._c.state_of)

    def state_dict(self):
        self._push_hyperparams()
        return self._torch_layout(self._c.state_dict())

    def load_state_dict(self, state_dict):
        self._c.load_state_dict(self._dopt_layout(state_dict))
        self._adopt_groups(state_dict)

    def set_num_threads(self, n):
        """dopt only: spread step() over n threads."""
        self._c.set_num_threads(n)


def _make_class(name):
    doc = (f"torch.optim.{name} computed by dopt (same arguments; torch 1.13's single-tensor results, "
           "bit for bit, in float32 and float64).")
    return type(name, (Optimizer,), {"_dopt_name": name, "__doc__": doc, "__module__": __name__})


for _name in registered_optimizers():
    globals()[_name] = _make_class(_name)
    __all__.append(_name)


def from_torch(optimizer):
    """dopt's optimizer of the same class as the torch.optim optimizer
    ``optimizer``, over the same parameters and groups, with its state."""
    if isinstance(optimizer, Optimizer):
        return optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("expected a torch.optim.Optimizer, got " + type(optimizer).__name__)
    name, _ = resolve_optimizer_class(type(optimizer))
    cls = globals()[name]
    groups = [dict(g) for g in optimizer.param_groups]
    out = cls(groups)
    if len(optimizer.state) > 0:
        out.load_state_dict(optimizer.state_dict())
    return out
