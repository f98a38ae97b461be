"""Model averagers: torch.distributed.algorithms.model_averaging.averagers
and hierarchical_model_averager, computed by dopt.

``import dopt.averagers as averagers`` in place of
``import torch.distributed.algorithms.model_averaging.averagers as averagers``.
The parameters are averaged in place (torch re-points ``p.data`` at a flat
buffer; dopt writes the averages into each parameter's own memory, with the
same values, bit for bit: gloo's ring summation order at 3 or more ranks).
"""
import weakref

import torch

from . import _C
from ._tensor import to_dopt
from .distributed import NotAMember, ProcessGroup, resolve_process_group

__all__ = ["ModelAverager", "PeriodicModelAverager", "HierarchicalModelAverager", "get_params_to_average",
           "average_parameters", "average_parameters_or_parameter_groups"]


def get_params_to_average(params):
    """torch's filter: the parameters (or those of param groups) with a gradient."""
    out = []
    for p in params:
        if isinstance(p, dict):
            out.extend(q for q in p["params"] if q.grad is not None)
        elif isinstance(p, torch.Tensor):
            if p.grad is not None:
                out.append(p)
        else:
            raise NotImplementedError(f"Parameter input of type {type(p)} is not supported")
    return out


class _DoptTensors:
    """dopt tensors for torch tensors, made once per tensor (while its memory stays)."""

    def __init__(self):
        self._cache = {}

    def __call__(self, tensors):
        out = []
        for t in tensors:
            hit = self._cache.get(id(t))
            if hit is None or hit[0]() is not t or hit[2] != t.data_ptr():
                hit = (weakref.ref(t), to_dopt(t, requires_grad=False), t.data_ptr())
                self._cache[id(t)] = hit
            out.append(hit[1])
        if len(self._cache) > 4 * max(len(tensors), 64):
            self._cache = {k: v for k, v in self._cache.items() if v[0]() is not None}
        return out


class ModelAverager:
    """Base class: ``average_parameters(params)`` averages the parameters that
    have a gradient when the schedule says so, then ``step += 1``."""

    def __init__(self, c):
        self._c = c
        self._tensors = _DoptTensors()

    @property
    def step(self):
        return self._c.step

    @step.setter
    def step(self, value):
        self._c.step = int(value)

    @property
    def warmup_steps(self):
        return self._c.warmup_steps

    def will_average(self):
        """dopt only: whether the next call averages."""
        return self._c.will_average()

    def average_parameters(self, params):
        """Collective on averaging steps (every rank of the group, same
        parameters with gradients). Non-contiguous parameters (channels_last,
        a transposed view) are averaged through a contiguous copy."""
        if not self._c.will_average():  # a step that only counts: no tensor looked at
            self._c.average([])
            return
        params = get_params_to_average(params)
        if all(p.is_contiguous() for p in params):
            self._c.average(self._tensors(params))
            return
        staged = [p if p.is_contiguous() else p.detach().contiguous() for p in params]
        self._c.average([self._tensors([t])[0] if t is p else to_dopt(t, requires_grad=False)
                         for t, p in zip(staged, params)])
        with torch.no_grad():
            for t, p in zip(staged, params):
                if t is not p:
                    p.copy_(t)

    def _average_dopt(self, dopt_tensors):
        self._c.average(dopt_tensors)


class _OutsideTheGroup:
    """The averager of a rank outside its torch group: it counts steps and
    averages nothing, as torch's averagers do on such a rank."""

    def __init__(self, warmup_steps):
        self.step = 0
        self.warmup_steps = int(warmup_steps)

    def will_average(self):
        return False

    def average(self, tensors):
        self.step += 1


def _group_or_outside(process_group, where):
    """(dopt group, None) or (None, True) for the placeholder torch gives non-members."""
    try:
        return resolve_process_group(process_group, where), False
    except NotAMember:
        return None, True


class PeriodicModelAverager(ModelAverager):
    """Averages every ``period`` steps after ``warmup_steps`` (torch's). On
    a rank outside a torch ``process_group`` it averages nothing (torch's)."""

    def __init__(self, period, warmup_steps=0, process_group=None):
        group, outside = _group_or_outside(process_group, "PeriodicModelAverager")
        self.process_group = process_group if outside else group
        self.period = int(period)
        if outside:
            super().__init__(_OutsideTheGroup(warmup_steps))
            return
        super().__init__(_C.PeriodicModelAverager(int(period), int(warmup_steps), group.c))


class HierarchicalModelAverager(ModelAverager):
    """Averages within subgroups of increasing size at increasing periods
    (torch's; subgroups made with ``new_subgroups``, which works on CPU)."""

    def __init__(self, period_group_size_dict=None, warmup_steps=0, process_group=None):
        if not period_group_size_dict:
            raise _C.ValueError("Arg ``period_group_size_dict`` must not be empty.")
        self.process_group = resolve_process_group(process_group, "HierarchicalModelAverager")
        super().__init__(_C.HierarchicalModelAverager({int(k): int(v) for k, v in period_group_size_dict.items()},
                                                      int(warmup_steps), self.process_group.c))
        self.period_group_size_dict = dict(period_group_size_dict)
        # torch's attribute: period -> the group averaged over at that period
        # (this rank's subgroup of that size; the whole group at its size).
        self.period_process_group_dict = {
            int(k): (self.process_group if g.size() == self.process_group.size() else ProcessGroup(g))
            for k, g in sorted(self._c.period_process_groups.items())}


def average_parameters(params, process_group=None):
    """Averages ``params`` (an iterable of tensors) over the group, in place."""
    group = resolve_process_group(process_group, "average_parameters")
    _C.average_parameters([to_dopt(p, requires_grad=False) for p in params], group.c)


def average_parameters_or_parameter_groups(params, process_group=None):
    """torch's: averages the parameters (or those of param groups) that have a gradient."""
    average_parameters(get_params_to_average(params), process_group)
