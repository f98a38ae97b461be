"""dopt.PostLocalSGDOptimizer: torch.distributed.optim.PostLocalSGDOptimizer
with dopt's local optimizer and model averager."""
import warnings

import torch

from . import optim as _optim
from ._groups import kernels_compute
from .averagers import ModelAverager

__all__ = ["PostLocalSGDOptimizer"]


def _computes(optimizer):
    """Whether dopt's kernels compute this torch optimizer exactly (its class, its groups' options)."""
    if isinstance(optimizer, _optim.Optimizer):
        return True
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("dopt.PostLocalSGDOptimizer: optim must be a torch.optim.Optimizer, got "
                        + type(optimizer).__name__)
    return kernels_compute(type(optimizer), {}, optimizer.param_groups)


class PostLocalSGDOptimizer(torch.optim.Optimizer):
    r"""Runs the local optimizer at every step and, from the averager's
    warm-up on, averages the parameters on its schedule (torch's).

    ``optim`` is a dopt local optimizer (``dopt.optim.SGD(...)``) or any
    torch.optim optimizer. One of a class dopt computes (torch.optim.SGD,
    Adam, ... with no torch-only option set) is converted to dopt's
    optimizer of the same class (same parameters, groups and state; use the
    wrapper afterwards, not the torch optimizer); any other one (your own
    class, a subclass, ``foreach=True``) steps itself, and dopt averages its
    parameters. ``averager`` is a dopt averager
    (``dopt.averagers.PeriodicModelAverager``).

    ``state_dict()`` is the local optimizer's plus ``'step'``, the averager's
    step, exactly as torch's, so torch's and dopt's load each other's.
    """

    def __init__(self, optim, averager):
        if not isinstance(averager, ModelAverager):
            raise TypeError("dopt.PostLocalSGDOptimizer needs a dopt averager (dopt.averagers.PeriodicModelAverager "
                            "or HierarchicalModelAverager), got " + type(averager).__name__)
        self.optim = _optim.from_torch(optim) if _computes(optim) else optim
        self._dopt_steps = isinstance(self.optim, _optim.Optimizer)
        self.param_groups = self.optim.param_groups
        self.averager = averager
        self.defaults = self.optim.defaults

    @property
    def state(self):
        return self.optim.state

    def __repr__(self):
        return self.optim.__repr__()

    def state_dict(self):
        sd = self.optim.state_dict()
        sd["step"] = self.averager.step
        return sd

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)
        if "step" in state_dict:
            self.averager.step = state_dict["step"]
        else:
            warnings.warn("Loaded state dict does not contain a step counter for an averager. "
                          "Setting step counter to 0.")
            self.averager.step = 0

    def step(self, *args, **kwargs):
        """The local step (arguments go to the local optimizer's ``step``),
        then averaging on the averager's schedule (a collective over its
        group on averaging steps)."""
        loss = self.optim.step(*args, **kwargs)
        if self._dopt_steps:
            # The parameters the local step just bound, with their gradients:
            # no conversion per step (torch's filter: those with a gradient).
            dts = [e.dt for e in self.optim._binding.entries if e.param.grad is not None]
            self.averager._average_dopt(dts)
        else:
            self.averager.average_parameters(self.optim.param_groups)
        return loss

    def zero_grad(self, set_to_none: bool = False):
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)
