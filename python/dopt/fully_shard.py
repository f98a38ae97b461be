"""dopt.fully_shard: ZeRO stage 3 (sharded parameters) for a torch module,
driven by module and autograd hooks as torch's FullyShardedDataParallel is.
docs/python-sharded.md ("Sharded parameters (ZeRO-3)") explains what each rank holds
and moves.

    opt = dopt.fully_shard(model, torch.optim.Adam, lr=1e-3)
    loss_fn(model(x), y).backward()
    opt.step()

Who calls what: every rank of the process group builds it, runs the forward
and the backward and calls ``step()`` in the same order (each gather and
reduction is a collective); one Python thread per rank, the one that runs
the forward and the backward (torch runs a CPU backward on it, hooks
included). The hooks: a unit's forward pre-hook gathers it (waiting for its
prefetch) and prefetches the next unit of the forward order; its forward
hook frees the full parameters and hooks the unit's outputs, whose gradient
hook gathers the unit again before its backward (and, with
``backward_prefetch="before_backward"``, the default, prefetches the
previous unit). Once every parameter of a unit has its gradient (hooks on
their AccumulateGrad nodes), the unit's gathered memory turns into its
gradients (dopt's release_for_gradients, which waits for the later unit's
reduction), the previous unit is prefetched (``"after_gradients"``; else it
is in flight already), the gradients are copied in, reduced there and
dropped. Without dopt._storage (built where CMake finds libtorch) the
parameters are a copy of the gathered unit and the gradients are copied
into a reduction buffer of their own. At the end of the backward (torch's
engine callback) the units it did not reach are reduced too, the last
reduction is waited for, and every unit is freed.
"""
import dataclasses
import enum
import os

import torch
from torch.autograd import Variable

from . import _C

try:  # points the units' storages at dopt's gathered memory (python/storage); absent: a copy of each unit
    from . import _storage
except ImportError:
    _storage = None
from ._groups import GroupedOptimizer, dopt_keys, resolve_optimizer_class, split_hyperparams, torch_only_defaults
from ._tensor import to_dopt, to_torch
from .distributed import resolve_process_group

__all__ = ["fully_shard", "FullyShardedOptimizer"]

_BACKWARD_PREFETCH = ("before_backward", "after_gradients")


def _backward_prefetch(value, where):
    """``value`` as one of _BACKWARD_PREFETCH: those names, or torch FSDP's
    ``BackwardPrefetch.BACKWARD_PRE`` / ``BACKWARD_POST``, recognised by the
    enum's class and member names without importing torch.distributed.fsdp
    (which fails to import with torch 1.13 under Python 3.11)."""
    if isinstance(value, enum.Enum) and type(value).__name__ == "BackwardPrefetch":
        value = {"BACKWARD_PRE": "before_backward", "BACKWARD_POST": "after_gradients"}.get(value.name, value)
    if isinstance(value, str) and value in _BACKWARD_PREFETCH:
        return value
    raise _C.ValueError(f"{where}: backward_prefetch={value!r} is not 'before_backward' (torch's "
                        "BackwardPrefetch.BACKWARD_PRE) or 'after_gradients' (BACKWARD_POST); dopt always prefetches "
                        "in the backward, None is not a choice")


def _rank_list(ranks):
    """'rank 5' / 'ranks 0-2, 4' (ascending ranks)."""
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def _agree_backward_prefetch(group, value, where):
    """Collective (one all_reduce of one int64 per rank): ``value`` as
    _backward_prefetch gives it, once every rank of ``group`` is known to pass
    the same choice; else ValueError on every rank naming each rank's (a rank
    whose value is none of the choices raises its own error, the others name
    it)."""
    try:
        mine, error = _BACKWARD_PREFETCH.index(_backward_prefetch(value, where)), None
    except _C.ValueError as e:
        mine, error = -1, e
    codes = torch.zeros(group.size(), dtype=torch.int64)
    codes[group.rank()] = mine + 1  # 0: not a choice
    group.all_reduce(codes, "sum")
    if error is not None:
        raise error
    codes = codes.tolist()
    if all(c == codes[0] for c in codes):
        return _BACKWARD_PREFETCH[mine]
    each = []
    for c in dict.fromkeys(codes):  # by first rank
        ranks = [r for r, k in enumerate(codes) if k == c]
        what = f"'{_BACKWARD_PREFETCH[c - 1]}'" if c else "a value that is not a choice (see its error)"
        each.append(f"{_rank_list(ranks)} {'passes' if len(ranks) == 1 else 'pass'} {what}")
    raise _C.ValueError(f"{where}: backward_prefetch differs between the ranks of the process group: "
                        f"{', '.join(each)}; pass the same backward_prefetch on every rank (it decides when each "
                        "rank posts the backward's all_gathers and how many unit buffers it holds)")


def _tensors(x):
    """The tensors in a module's output (a tensor, or lists, tuples and dicts of them)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from _tensors(getattr(x, f.name))


def _broadcast_from_0(group, t):
    """t (any dense CPU tensor) takes group rank 0's values, in place."""
    buf = t.detach() if t.is_contiguous() else t.detach().contiguous()
    group.broadcast(buf.view(torch.uint8) if buf.dtype == torch.bool else buf, 0)
    if buf.data_ptr() != t.data_ptr():
        t.detach().copy_(buf)


def _contains(outer, inner):
    return any(m is inner for m in outer.modules())


def split_units(module, units, where):
    """[(submodule, [(name, parameter)])]: the root's parameters in no listed
    unit first (the root is a unit), then each listed unit's parameters less
    those of units nested in it. Default units: the direct children that
    have trainable parameters. Frozen parameters (requires_grad False) stay
    whole and are in no unit. Units without parameters are left out."""
    if units is None:
        units = [c for c in module.children() if any(p.requires_grad for p in c.parameters())]
    elif isinstance(units, torch.nn.Module):
        raise TypeError(f"{where}: units must be a list of submodules, got one {type(units).__name__}")
    units = list(units)
    for i, m in enumerate(units):
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"{where}: unit {i} is a {type(m).__name__}, not a torch.nn.Module")
        if m is module or not _contains(module, m):
            raise _C.ValueError(f"{where}: unit {i} ({type(m).__name__}) is not a submodule of the module "
                                "(the module itself is always a unit: it holds the parameters no unit takes)")
    owner = {}
    for i, m in enumerate(units):
        for p in m.parameters():
            j = owner.get(id(p))
            if j is None or _contains(units[j], m):  # the innermost unit takes it
                owner[id(p)] = i
    # A parameter used by a unit that does not own it, and not nested in its
    # owner, is shared between units (tied weights): it would be gathered
    # with one of them only.
    for i, m in enumerate(units):
        for p in m.parameters():
            j = owner[id(p)]
            if j != i and not _contains(m, units[j]):
                pname = next((n for n, q in module.named_parameters() if q is p), "?")
                raise _C.ValueError(
                    f"{where}: parameter '{pname}' is shared by unit {i} ({type(m).__name__}) and unit {j} "
                    f"({type(units[j]).__name__}): tied parameters must be in one unit (pass units= with a module "
                    "that holds both users, or leave both to the root's unit)")
    out = [(module, [])] + [(m, []) for m in units]
    for name, p in module.named_parameters():
        if p.requires_grad:
            out[owner.get(id(p), -1) + 1][1].append((name, p))
    return [(m, ps) for m, ps in out if ps]


class _Unit:
    """One unit: its module, parameters, and the flat buffer whose views the
    parameters are while the unit is gathered (its storage is freed, size 0,
    otherwise: views that autograd saved keep pointing into it, as in torch's
    FSDP)."""

    def __init__(self, index, module, named):
        self.index = index
        self.module = module
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        numel = sum(p.numel() for p in self.params)
        self.flat = torch.empty(numel, dtype=torch.float32)
        self.views, at = [], 0
        for p in self.params:
            self.views.append(self.flat[at:at + p.numel()].view(p.shape))
            at += p.numel()
        self.flat.storage().resize_(0)  # allocated when gathered
        self.numel = numel
        self.live = False       # the parameters are views of `flat`
        self.in_flight = False  # prefetched and not yet gathered
        self.ready = 0          # parameters whose gradient arrived in this backward
        self.reduced = False    # reduced in this iteration
        self.accumulators = []  # the parameters' AccumulateGrad nodes (kept alive: the hooks are on them)


class FullyShardedOptimizer(GroupedOptimizer):
    r"""The optimizer ``dopt.fully_shard(module, ...)`` returns: it owns the
    module's sharded parameters (ZeRO stage 3 over dopt's ``ShardedUnits``).

    ``step()`` is local (each rank steps its shards); the constructor,
    ``state_dict()`` and ``full_parameters()`` are collectives, as are the
    forward and backward of the module. ``param_groups`` holds one group
    (torch's LR schedulers work: a changed hyperparameter reaches dopt at
    the next step). ``zero_grad()`` has nothing to clear: the full gradients
    are dropped once reduced, each rank's shard of the average lives in dopt.
    """

    uses_dopt_kernels = True

    def __init__(self, module, optimizer_class=torch.optim.Adam, units=None, process_group=None,
                 backward_prefetch="before_backward", **defaults):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"dopt.fully_shard: expected a torch.nn.Module, got {type(module).__name__}")
        self._where = "dopt.fully_shard"
        if getattr(module, "_dopt_fully_shard", None) is not None:
            raise _C.ValueError(f"{self._where}: the module is sharded already (its hooks and parameters belong to "
                                "the FullyShardedOptimizer that fully_shard returned for it)")
        name, torch_cls = resolve_optimizer_class(optimizer_class)
        self._name, self._torch_cls = name, torch_cls
        ours, theirs = split_hyperparams(name, torch_cls, defaults, self._where)
        self._keys = dopt_keys(name)
        self._dopt_defaults = ours
        self._group = resolve_process_group(process_group, self._where)
        self.backward_prefetch = _agree_backward_prefetch(self._group, backward_prefetch,
                                                          f"{self._where} [rank {self._group.rank()}]")
        split = split_units(module, units, self._where)
        if not split:
            raise _C.ValueError(f"{self._where}: the module has no trainable parameters")
        for _, named in split:
            for n, p in named:
                if p.dtype != torch.float32 or p.device.type != "cpu":
                    raise _C.TypeError(f"{self._where} [rank {self._group.rank()}]: parameter '{n}' is {p.dtype} on "
                                       f"{p.device}; fully_shard shards float32 CPU parameters only")
        # What is not sharded but must be the same everywhere: rank 0's frozen
        # parameters and buffers (the sharded ones are broadcast below).
        with torch.no_grad():
            for t in [p for p in module.parameters() if not p.requires_grad] + list(module.buffers()):
                _broadcast_from_0(self._group, t)
        c = _C.ShardedUnits([[to_dopt(p.detach().contiguous(), requires_grad=False) for _, p in named]
                             for _, named in split], name, ours, self._group.c)
        self.module = module
        self._units = [_Unit(i, m, named) for i, (m, named) in enumerate(split)]
        params = [p for u in self._units for p in u.params]
        self.param_names = [n for u in self._units for n in u.names]
        self.defaults = dict(torch_only_defaults(name, torch_cls), **theirs)
        self.param_groups = [dict(self.defaults, params=params)]
        self._synced, self._stepped, self._skips_some = [None], [list(range(len(params)))], False
        self._after_groups_built(c)
        self.rank, self.world_size = c.rank, c.world_size  # in the process group
        self.defaults.update({k: v for k, v in self.param_groups[0].items() if k != "params"})
        self.state = {}
        self._order, self._order_fixed = [], False  # the units in forward order (the first forward's)
        self._place = {}  # unit -> its index in _order
        self._in_backward = False
        self._reducing = None
        self._handles = []
        # With dopt._storage the parameters are views of dopt's gathered memory,
        # which turns into the unit's gradients once they exist (two unit
        # buffers in the backward); without it, of a copy of it.
        self._in_place = _storage is not None
        with torch.enable_grad():
            for unit in self._units:
                self._install(unit)
        module._dopt_fully_shard = self

    # --- the hooks ---------------------------------------------------------------------
    def _install(self, unit):
        """Frees the unit's parameters and hooks its module and their AccumulateGrad nodes."""
        u = unit.index
        for p in unit.params:
            # The node is made while p has its shape (autograd checks gradients against it).
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._handles.append(acc.register_hook(lambda grads_in, grads_out, u=u: self._grad_ready(u)))
            unit.accumulators.append(acc)
            p.data = torch.empty(0)
            p.grad = None
        self._handles.append(unit.module.register_forward_pre_hook(lambda m, inputs, u=u: self._before_forward(u)))
        self._handles.append(unit.module.register_forward_hook(lambda m, inputs, out, u=u: self._after_forward(u, out)))

    def _neighbour(self, u, step):
        """The unit after (step 1) or before (step -1) u in the forward order, once it is known."""
        if not self._order_fixed or u not in self._place:
            return None
        i = self._place[u] + step
        return self._order[i] if 0 <= i < len(self._order) else None

    def _prefetch(self, u):
        if u is None:
            return
        unit = self._units[u]
        if not (unit.live or unit.in_flight or unit.reduced):
            self._c.prefetch(u)
            unit.in_flight = True

    def _gather(self, u):
        unit = self._units[u]
        if unit.live:
            return
        full = self._c.gather(u)  # waits for its prefetch
        unit.in_flight = False
        if self._in_place:
            # `flat`'s storage points at dopt's buffer (the views of one buffer, in order), until released.
            base = to_torch(full[0]).data_ptr()
            for i, (view, t) in enumerate(zip(unit.views, full)):
                if to_torch(t).data_ptr() != base + (view.data_ptr() - unit.views[0].data_ptr()):
                    raise _C.StateError(f"dopt FullyShardedOptimizer [rank {self.rank}]: unit {u} parameter {i} is "
                                        "not where the flat layout puts it in ShardedUnits' buffer")
            _storage.point(unit.flat._cdata, base, 4 * unit.numel)
            del full
        else:
            unit.flat.storage().resize_(unit.numel)
            with torch.no_grad():
                for view, t in zip(unit.views, full):
                    view.copy_(to_torch(t))
            del full
            self._c.release(u)  # dopt's buffer: the copy in `flat` is the one used
        for p, view in zip(unit.params, unit.views):
            p.data = view
        unit.live = True

    def _release(self, u):
        unit = self._units[u]
        if unit.in_flight:
            self._c.release(u)  # waits for the all_gather
            unit.in_flight = False
        if not unit.live:
            return
        for p in unit.params:
            p.data = torch.empty(0)
        if self._in_place:
            _storage.point(unit.flat._cdata, 0, 0)  # before dopt reuses the memory
            self._c.release(u)
        else:
            unit.flat.storage().resize_(0)
        unit.live = False

    def _before_forward(self, u):
        if not self._order_fixed and u not in self._place:
            self._place[u] = len(self._order)
            self._order.append(u)
        self._gather(u)
        self._prefetch(self._neighbour(u, 1))

    def _after_forward(self, u, output):
        hooked = False
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda grad, u=u: self._before_backward(u))
                    hooked = True
        if hooked or not torch.is_grad_enabled():
            self._release(u)
        # Else the output holds its tensors where dopt cannot see them (an
        # object of the user's own): nothing would gather the unit again
        # before its backward, so it stays gathered until the backward ends.

    def _before_backward(self, u):
        if not self._in_backward:
            if any(unit.reduced for unit in self._units):
                self._second_backward(u)
            self._in_backward = True
            self._order_fixed = True
            Variable._execution_engine.queue_callback(self._after_backward)
        if self._units[u].reduced:
            return
        self._gather(u)
        if self.backward_prefetch == "before_backward":  # overlaps u's backward: three unit buffers
            self._prefetch(self._neighbour(u, -1))
        # else once this unit's gradients took its memory (_grad_ready): two

    def _grad_ready(self, u):
        unit = self._units[u]
        if unit.reduced:
            self._second_backward(u)
        unit.ready += 1
        if unit.ready != len(unit.params):
            return
        if self._in_place and unit.live:
            self._reduce_in_gathered(u)
        else:  # a copy of the gathered unit, or gradients that came without its gather (no output hook ran)
            self._reduce(u)
            self._release(u)
            self._prefetch(self._neighbour(u, -1))  # after_gradients (before_backward: in flight already)

    def _second_backward(self, u):
        raise _C.StateError(f"dopt FullyShardedOptimizer [rank {self.rank}]: a second backward before step() (unit {u}'s gradients were "
                            "reduced already in this iteration); fully_shard takes one backward per step")

    def _reduce(self, u):
        """Collective: the unit's gradients to dopt (copied there), then dropped."""
        unit = self._units[u]
        grads = [None if p.grad is None else to_dopt(p.grad.detach().contiguous(), requires_grad=False)
                 for p in unit.params]
        self._reducing = self._c.reduce_gradients_async(u, grads)
        unit.reduced = True
        for p in unit.params:
            p.grad = None

    def _reduce_in_gathered(self, u):
        """Collective: autograd has stored every gradient of the unit, so no node
        reads its parameters again; their memory (dopt's gathered buffer) becomes
        the gradients' (zeroed), the unit before is prefetched, the gradients are
        copied in and reduced there."""
        unit = self._units[u]
        grads = [p.grad for p in unit.params]
        for p in unit.params:
            p.grad = None
            p.data = torch.empty(0)
        _storage.point(unit.flat._cdata, 0, 0)  # torch lets go of the memory before it turns into gradients
        unit.live = False
        views = self._c.release_for_gradients(u)  # waits for the later unit's reduction: its buffer serves the prefetch
        self._prefetch(self._neighbour(u, -1))
        with torch.no_grad():
            for view, g in zip(views, grads):
                if g is not None:
                    to_torch(view).copy_(g)
        del grads, views
        self._reducing = self._c.reduce_gradients_in_place_async(u)
        unit.reduced = True

    def _after_backward(self):
        self._in_backward = False
        for unit in self._units:
            if not unit.reduced:  # a unit this backward did not reach: its gradients as they are (None: zeros)
                self._reduce(unit.index)
            unit.ready = 0
        if self._reducing is not None:
            self._reducing.wait()
            self._reducing = None
        for unit in self._units:
            self._release(unit.index)

    # --- torch's optimizer methods -----------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """Local: steps this rank's shards with the averaged gradients of the
        last backward (every unit's: StateError before a backward). Returns
        the closure's loss."""
        loss = self._closure_loss(closure)
        if not any(unit.reduced for unit in self._units):
            raise _C.StateError(f"dopt FullyShardedOptimizer.step [rank {self.rank}]: no backward since the last step "
                                "(or since the start): call loss.backward() before step()")
        for unit in self._units:  # the next forward gathers the new values
            self._release(unit.index)
        self._push_hyperparams()
        self._c.step()
        for unit in self._units:
            unit.reduced = False
        return loss

    def state_dict(self):
        """Collective: the consolidated state in torch's layout (one group;
        index i is ``param_names[i]``), on every rank."""
        return self._torch_layout(self._c.state_dict())

    def load_state_dict(self, state_dict):
        """Local: a consolidated state dict (this class's, or a torch optimizer's
        or a ZeroRedundancyOptimizer's over the parameters in ``param_names``
        order, one group); each rank keeps its shard."""
        self._c.load_state_dict(self._dopt_layout(state_dict))
        self._adopt_groups(state_dict)

    # --- dopt's additions --------------------------------------------------------------
    def full_parameters(self):
        """Collective: {name: full parameter} (copies), names as in ``module.named_parameters()``."""
        return dict(zip(self.param_names, (to_torch(t) for t in self._c.full_parameters())))

    def load_full_parameters(self, full):
        """Local, between iterations: sets every parameter from ``full``
        ({name: tensor}, as ``full_parameters()`` returns; each rank keeps its
        shards). The optimizer's state is left as it is (``load_state_dict``)."""
        missing = [n for n in self.param_names if n not in full]
        if missing:
            raise _C.KeyError(f"dopt FullyShardedOptimizer.load_full_parameters: no value for {', '.join(missing)}")
        shapes = {n: v.shape for u in self._units for n, v in zip(u.names, u.views)}
        for n in self.param_names:
            if tuple(full[n].shape) != tuple(shapes[n]):
                raise _C.ShapeError(f"dopt FullyShardedOptimizer.load_full_parameters [rank {self.rank}]: '{n}' has "
                                    f"shape {list(full[n].shape)}, the parameter {list(shapes[n])}")
        for unit in self._units:
            self._release(unit.index)
        self._c.load_parameters([to_dopt(full[n].detach().float().contiguous(), requires_grad=False)
                                 for n in self.param_names])

    def save_sharded(self, dir):
        """Collective: writes each rank's shards of the parameters and of the
        state to ``dir`` (one file per rank; every rank learns whether all
        were written)."""
        self._push_hyperparams()
        self._c.save_sharded(os.fspath(dir))

    def load_sharded(self, dir):
        """Local, between iterations: loads what ``save_sharded`` wrote, at any
        world size (each rank reads the files holding its new part). Returns
        the world size it was saved at."""
        self._release_all()
        saved = self._c.load_sharded(os.fspath(dir))
        self._pull_hyperparams()
        return saved

    def _release_all(self):
        for unit in self._units:
            self._release(unit.index)

    @property
    def units(self):
        """The modules whose parameters form each unit, in dopt's unit order."""
        return [u.module for u in self._units]

    def unit_numels(self):
        """Elements of each unit's parameters."""
        return [self._c.unit_numel(u.index) for u in self._units]

    def shard_numels(self):
        """Elements of this rank's shard of each unit (ceil(unit's elements / world size))."""
        return [self._c.shard_numel(u.index) for u in self._units]

    @property
    def bytes(self):
        """Bytes this rank keeps between iterations: its parameter shards, their gradients and the optimizer's state."""
        return self._c.bytes

    @property
    def gathered_bytes(self):
        """Bytes of the full parameters held now: dopt's gather buffers (with the
        one it keeps for the next gather until ``step()``) and, when the units are
        copies of them (no ``dopt._storage``), the units' flat buffers."""
        return self._c.gathered_bytes + self._copies_bytes()

    @property
    def buffer_bytes(self):
        """Bytes of every unit-sized buffer held now: ``gathered_bytes`` and dopt's
        gradient buffers (under reduction, or kept for the next one); 0 after ``step()``."""
        return self._c.buffer_bytes + self._copies_bytes()

    def _copies_bytes(self):
        return 0 if self._in_place else sum(4 * u.numel for u in self._units if u.live)

    def __del__(self):
        # Views autograd saved may outlive the optimizer: no storage keeps pointing into dopt's memory.
        if getattr(self, "_in_place", False) and _storage is not None:
            for unit in getattr(self, "_units", []):
                if unit.live:
                    for p in unit.params:
                        p.data = torch.empty(0)
                _storage.point(unit.flat._cdata, 0, 0)


def fully_shard(module, optimizer_class=torch.optim.Adam, units=None, process_group=None,
                backward_prefetch="before_backward", **defaults):
    """Shards ``module``'s parameters over the process group (ZeRO stage 3) and
    returns the optimizer that steps them (a ``FullyShardedOptimizer``).

    Collective: every rank calls it with the same module structure; rank 0's
    values win (they are broadcast). ``optimizer_class``: one of the elementwise
    optimizers dopt computes (torch.optim's SGD, Adam, AdamW, Adagrad, RMSprop,
    Adamax, Adadelta, Rprop, or dopt.optim's, or the name; not Muon); ``units``: the submodules
    whose parameters are gathered together (default: each direct child with
    trainable parameters; the module's remaining parameters form one more
    unit); ``process_group`` as for ``ZeroRedundancyOptimizer``;
    ``backward_prefetch``: when the backward starts gathering the unit before
    unit u: ``"before_backward"`` (default; torch's
    ``BackwardPrefetch.BACKWARD_PRE``), overlapping u's backward, three
    unit-sized buffers; ``"after_gradients"`` (``BACKWARD_POST``), once u's
    gradients took u's gathered memory, two; the same on every rank (the
    constructor compares them: ValueError on every rank otherwise); ``defaults``: the optimizer's
    hyperparameters (``lr=...``).

    Afterwards each parameter is empty (``numel() == 0``) except while its
    unit is gathered during a forward or backward of ``module``."""
    return FullyShardedOptimizer(module, optimizer_class, units=units, process_group=process_group,
                                 backward_prefetch=backward_prefetch, **defaults)
