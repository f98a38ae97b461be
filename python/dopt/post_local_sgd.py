"""dopt.PostLocalSGDOptimizer: torch.distributed.optim.PostLocalSGDOptimizer
with dopt's model averager (and dopt's local optimizer when given one)."""
import warnings

import torch

from . import optim as _optim
from .averagers import ModelAverager

__all__ = ["PostLocalSGDOptimizer"]


class PostLocalSGDOptimizer(torch.optim.Optimizer):
    r"""Runs the local optimizer at every step and, from the averager's
    warm-up on, averages the parameters on its schedule (torch's).

    ``optim`` is any torch.optim optimizer, used as it is (as torch's
    wrapper uses it: the wrapper's ``param_groups`` and ``state`` are the
    optimizer's own, schedulers may be attached to either), or a dopt local
    optimizer (``dopt.optim.SGD(...)``) for dopt's kernels in the local step.
    ``averager`` is a dopt averager (``dopt.averagers.PeriodicModelAverager``).

    ``state_dict()`` is the local optimizer's plus ``'step'``, the averager's
    step, exactly as torch's, so torch's and dopt's load each other's.
    """

    def __init__(self, optim, averager):
        if not isinstance(averager, ModelAverager):
            raise TypeError("dopt.PostLocalSGDOptimizer needs a dopt averager (dopt.averagers.PeriodicModelAverager "
                            "or dopt.averagers.HierarchicalModelAverager), got "
                            f"{type(averager).__module__}.{type(averager).__qualname__}")
        if not isinstance(optim, torch.optim.Optimizer):
            raise TypeError("dopt.PostLocalSGDOptimizer: optim must be a torch.optim.Optimizer, got "
                            f"{type(optim).__module__}.{type(optim).__qualname__}")
        self.optim = optim
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
