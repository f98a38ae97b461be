"""dopt.Checkpointer: training checkpoints of a data-parallel job, saved and
resumed by every rank together, written by dopt's C++ Checkpointer
(docs/checkpointing.md: the folder, atomic commits, async saves, resharding;
docs/python-checkpoints.md, "Checkpoints": this class).

Who calls what. The constructor, ``save``, ``save_async``, ``load`` and
``load_latest`` are collectives of the process group: every rank calls them
at the same point of its loop, from the thread that issues its other
collectives, with the same step and the same items registered (same names,
kinds and placements, in the same order). ``add_*``, ``wait`` and the
properties are local. Registered objects are referenced, not copied: a save
reads them, a load writes into them.

Where each item's state goes:

* torch tensors (a dict, a module's ``state_dict()``) are shared with dopt
  through DLPack; dopt copies them at a save and copies into them at a load;
* the state that lives in dopt's C++ core (``dopt.optim`` optimizers, and
  ``dopt.ZeroRedundancyOptimizer`` over a class dopt computes) is saved by
  the C++ Checkpointer itself (ZeRO: one shard per rank, resharded at load);
* the state that lives in Python (a ``torch.optim`` optimizer, a ZeRO whose
  class steps the shard in Python, post-local SGD) is its ``state_dict()``
  in ``torch.save``'s format, held as one uint8 tensor of the checkpoint;
* a ``torch.Generator`` is its ``get_state()`` tensor; extras are JSON text.
"""
import collections.abc
import io
import json
import os
import re
import struct

import torch
from torch.distributed.optim import PostLocalSGDOptimizer as TorchPostLocalSGD
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

from . import _C
from ._tensor import to_dopt
from .distributed import resolve_process_group
from .fully_shard import FullyShardedOptimizer
from .optim import Optimizer as DoptOptimizer
from .post_local_sgd import PostLocalSGDOptimizer
from .zero import ZeroRedundancyOptimizer

__all__ = ["Checkpointer"]

_PLACEMENTS = ("replicated", "per_rank")
_BLOB = "torch_save"  # the entry of a Python-side state dict under its item's name


def _placement(placement, where):
    if placement not in _PLACEMENTS:
        raise _C.ValueError(f"dopt Checkpointer.{where}: placement must be 'replicated' or 'per_rank', "
                            f"got {placement!r}")
    return placement


def _share(item, key, t):
    """A dopt tensor over t's memory (no copy), or the error naming the item and key."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"dopt Checkpointer.add_tensors: '{item}': the value of '{key}' is a "
                        f"{type(t).__name__}, not a torch.Tensor")
    if t.layout != torch.strided or not t.is_contiguous():
        raise _C.ValueError(f"dopt Checkpointer.add_tensors: '{item}': the tensor '{key}' (shape {tuple(t.shape)}) "
                            "is not dense and contiguous; dopt shares the memory of contiguous tensors only "
                            "(register t.contiguous() and copy it back after a load)")
    return to_dopt(t, requires_grad=False)


# --- the checkpoint's files, for sizing Python-side state before a load ----------------

def _step_folder(directory, step):
    return os.path.join(directory, "step-%08d" % step)


def _latest_folder(directory):
    """The folder load_latest will load (the complete checkpoint of the highest
    step: docs/checkpointing.md, "The folder"), or None. Only a hint: the C++
    Checkpointer chooses and checks."""
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    steps = [int(m.group(1)) for m in map(re.compile(r"step-(\d+)").fullmatch, names)
             if m and os.path.isfile(os.path.join(directory, m.group(0), "checkpoint.json"))]
    return _step_folder(directory, max(steps)) if steps else None


def _saved_numel(path, entry):
    """The element count of tensor `entry` in the safetensors file `path`, read
    from its header; None when that cannot be told (the load then reports it)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > (1 << 30):
                return None
            shape = json.loads(f.read(n))[entry]["shape"]
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    numel = 1
    for d in shape:
        numel *= int(d)
    return numel


# --- the items ----------------------------------------------------------------------------

class _Item:
    """What the Python side does around the C++ save and load of one item."""

    def __init__(self, name):
        self.name = name

    def before_save(self, ckpt):
        pass

    def before_load(self, ckpt, folder):
        pass

    def after_load(self):
        pass

    def release(self):
        """After a save or a load, done or failed: lets go of what it held for it."""


class _Tensors(_Item):
    """Named torch tensors shared with dopt. A tensor whose memory moved since
    (``p.data = ...``, ZeRO's bucket views) is shared again before each save
    and load."""

    def __init__(self, name, current):
        super().__init__(name)
        self._current = current  # () -> {key: torch tensor}
        tensors = self._checked(current())
        self.dts = {k: _share(name, k, t) for k, t in tensors.items()}
        self._ptrs = {k: t.data_ptr() for k, t in tensors.items()}

    def _checked(self, tensors):
        if not all(isinstance(k, str) for k in tensors):
            raise TypeError(f"dopt Checkpointer.add_tensors: '{self.name}': the keys must be strings")
        return tensors

    def _refresh(self):
        tensors = self._checked(self._current())
        if set(tensors) != set(self.dts):
            raise _C.StateError(f"dopt Checkpointer: the tensors registered as '{self.name}' changed names since "
                                f"add_tensors (now {sorted(tensors)}, registered {sorted(self.dts)}); register "
                                "the tensors once, with a new Checkpointer for another model")
        for k, t in tensors.items():
            if t.data_ptr() != self._ptrs[k]:
                self.dts[k].set_data(_share(self.name, k, t))
                self._ptrs[k] = t.data_ptr()

    def before_save(self, ckpt):
        self._refresh()

    def before_load(self, ckpt, folder):
        self._refresh()


class _DoptState(_Item):
    """An optimizer whose state lives in dopt's C++ core (dopt.optim, ZeRO over
    dopt's kernels): the hyperparameters torch's side changed (a scheduler's
    lr) go to C++ before a save and come back after a load."""

    def __init__(self, name, optimizer):
        super().__init__(name)
        self.optimizer = optimizer

    def before_save(self, ckpt):
        self.optimizer._push_hyperparams()

    def after_load(self):
        self.optimizer._pull_hyperparams()


class _ShardedUnitsState(_DoptState):
    """``dopt.fully_shard``'s optimizer: dopt's sharded files hold its
    parameters and state; a load first lets go of the gathered units (the
    module's views of them)."""

    def before_load(self, ckpt, folder):
        self.optimizer._release_all()


class _PythonState(_Item):
    """An object whose state lives in Python: its state_dict() in torch.save's
    format, one uint8 tensor of the checkpoint. With ``consolidate``, every
    rank first gathers the global state on rank 0 (consolidate_state_dict),
    which saves it for all: every rank loads it and keeps its own part."""

    def __init__(self, name, obj, placement, consolidate):
        super().__init__(name)
        self.obj = obj
        self.placement = placement
        self.consolidate = consolidate
        self._buf = torch.zeros(1, dtype=torch.uint8)
        self.dt = to_dopt(self._buf, requires_grad=False)

    def _hold(self, buf):
        self._buf = buf
        self.dt.set_data(to_dopt(buf, requires_grad=False))

    def before_save(self, ckpt):
        if self.consolidate:
            self.obj.consolidate_state_dict(to=0)  # a collective of its group
        if self.placement == "replicated" and ckpt.rank != 0:
            return  # rank 0 writes the replicated items
        out = io.BytesIO()
        torch.save(self.obj.state_dict(), out)
        self._hold(torch.frombuffer(bytearray(out.getbuffer()), dtype=torch.uint8))

    def release(self):
        self._hold(torch.zeros(1, dtype=torch.uint8))

    def before_load(self, ckpt, folder):
        if folder is None:
            return
        file = "replicated.safetensors" if self.placement == "replicated" else \
            f"rank{ckpt.rank}-of-{ckpt.world_size}.safetensors"
        n = _saved_numel(os.path.join(folder, file), f"{self.name}/{_BLOB}")
        if n:
            self._hold(torch.empty(n, dtype=torch.uint8))

    def after_load(self):
        state = torch.load(io.BytesIO(self._buf.numpy().tobytes()), map_location="cpu")
        self.release()
        self.obj.load_state_dict(state)


class _Generator(_Item):
    """A torch.Generator: its get_state() tensor."""

    def __init__(self, name, generator):
        super().__init__(name)
        self.generator = generator
        self.state = generator.get_state().clone()
        self.dt = to_dopt(self.state, requires_grad=False)

    def before_save(self, ckpt):
        self.state.copy_(self.generator.get_state())

    def after_load(self):
        self.generator.set_state(self.state.clone())


def _decode(text):
    try:
        return json.loads(text)
    except ValueError:
        return text  # a plain string (a C++ program's extras)


class _Extras(_Item):
    """A dict of JSON values: each value's JSON text in the C++ Checkpointer's
    map of strings; a load replaces the dict's contents."""

    def __init__(self, name, extras, c):
        super().__init__(name)
        self.extras = extras
        self._c = c

    def before_save(self, ckpt):
        encoded = {}
        for k, v in self.extras.items():
            if not isinstance(k, str):
                raise TypeError(f"dopt Checkpointer.save: the extras '{self.name}' have the key {k!r}; keys must be "
                                "strings")
            try:
                encoded[k] = json.dumps(v)
            except (TypeError, ValueError) as e:
                raise TypeError(f"dopt Checkpointer.save: the extras '{self.name}': the value of '{k}' is not JSON "
                                f"({e}); extras hold numbers, strings, bools, None, lists and dicts of them") from None
        self._c.set_extras(self.name, encoded)

    def after_load(self):
        loaded = {k: _decode(v) for k, v in self._c.extras(self.name).items()}
        self.extras.clear()
        self.extras.update(loaded)


# --- the Checkpointer ------------------------------------------------------------------

def _route(optimizer):
    """How an optimizer's state is saved: "fully_shard" (dopt.fully_shard's:
    parameters and state, sharded), "zero" (dopt's C++ ZeRO, sharded),
    "consolidate" (a ZeRO whose state lives in Python: dopt's over a class
    dopt does not compute, or torch's own), "post_local_sgd" (Python, per
    rank), "dopt" (a dopt.optim optimizer, C++) or "python" (its state_dict)."""
    if isinstance(optimizer, FullyShardedOptimizer):
        return "fully_shard"
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return "zero" if optimizer.uses_dopt_kernels else "consolidate"
    if isinstance(optimizer, TorchZero):
        return "consolidate"
    if isinstance(optimizer, (PostLocalSGDOptimizer, TorchPostLocalSGD)):
        return "post_local_sgd"
    if isinstance(optimizer, DoptOptimizer):
        return "dopt"
    return "python"


class Checkpointer:
    r"""Checkpoints of a data-parallel job in ``dir``: one ``step-XXXXXXXX``
    folder per save, written atomically by every rank together.

    ``Checkpointer(dir, keep_last=0, process_group=None)``: ``keep_last``
    keeps only the newest complete checkpoints (0: all); ``process_group`` is
    None (the world: torch.distributed's when initialised, else the
    launcher's), torch's WORLD or a dopt group. A group other than the world
    needs ``commit_group``, a second dopt group over the same ranks
    (``dopt.get_world().new_group(ranks)``) used by nothing else.

    Register once, on every rank in the same order, then save and resume::

        ckpt.add_tensors("model", model)        # a torch.nn.Module, or a dict of tensors
        ckpt.add_optimizer("optim", zero)       # ZeRO: sharded, reshards at load
        ckpt.add_rng("dropout", generator)      # each rank's own by default
        ckpt.add_extras("meta", {"epoch": 0})
        start = ckpt.load_latest() or 0         # the step, or None: nothing saved yet
        ...
        ckpt.save_async(step)                   # returns after the snapshot
    """

    def __init__(self, dir, keep_last=0, process_group=None, commit_group=None,  # noqa: A002 (CheckpointerOptions::dir)
                 background_snapshot=False):
        if isinstance(keep_last, bool) or not isinstance(keep_last, int):
            raise TypeError(f"dopt Checkpointer: keep_last must be an int, got {type(keep_last).__name__}")
        if not isinstance(background_snapshot, bool):
            raise TypeError("dopt Checkpointer: background_snapshot must be a bool, got "
                            f"{type(background_snapshot).__name__}")
        self._group = resolve_process_group(process_group, "Checkpointer")
        commit = None if commit_group is None else resolve_process_group(commit_group, "Checkpointer").c
        self._c = _C.Checkpointer(self._group.c, os.fspath(dir), keep_last, commit, background_snapshot)
        self.background_snapshot = background_snapshot
        self.rank = self._group.rank()
        self.world_size = self._group.size()
        self._items = []
        self._held = False  # the items hold a save's copies until its snapshot is taken

    @property
    def dir(self):
        return self._c.dir

    @property
    def run(self):
        """The run id written into the next save (a load takes the checkpoint's)."""
        return self._c.run

    @property
    def process_group(self):
        return self._group

    # --- what is saved (local) ----------------------------------------------------------
    def add_tensors(self, name, tensors, placement="replicated"):
        """Named torch tensors: a ``torch.nn.Module`` (its ``state_dict()``:
        parameters and buffers) or a dict of tensors (a module's
        ``state_dict()``, ``dict(model.named_parameters())``). Dense and
        contiguous, on any device; a load copies into them in place (same
        shapes and dtypes). ``placement``: "replicated" (the same on every
        rank: rank 0 writes it, every rank loads it, at any world size) or
        "per_rank" (each rank's own; loads at the same world size only)."""
        _placement(placement, "add_tensors")
        if isinstance(tensors, torch.nn.Module):
            module = tensors
            item = _Tensors(name, module.state_dict)
        elif isinstance(tensors, collections.abc.Mapping):
            item = _Tensors(name, lambda: tensors)
        else:
            raise TypeError("dopt Checkpointer.add_tensors: tensors must be a torch.nn.Module or a dict of "
                            f"torch tensors, got {type(tensors).__name__}")
        self._c.add_tensors(name, item.dts, placement)
        self._items.append(item)

    def add_optimizer(self, name, optimizer, placement=None):
        """An optimizer of the package, or any torch.optim optimizer:

        * ``dopt.ZeroRedundancyOptimizer`` over a class dopt computes: dopt's
          sharded files (each rank its shard); loads at any world size;
        * the optimizer ``dopt.fully_shard`` returns: each rank's shards of
          the parameters and of the state (the module's parameters live only
          there: register no ``add_tensors`` for them); any world size;
        * ``dopt.ZeroRedundancyOptimizer`` over a Python class, and torch's
          own: consolidated on rank 0 and saved once; every rank loads it and
          keeps its part, at any world size;
        * ``dopt.optim.*``: its C++ state dict, ``placement`` "replicated"
          (the default: the same gradients on every rank, as with DDP) or
          "per_rank";
        * ``dopt.PostLocalSGDOptimizer`` (or torch's): its state dict, per rank;
        * any other ``torch.optim.Optimizer``: its ``state_dict()``,
          ``torch.save``d, "replicated" by default or "per_rank"."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("dopt Checkpointer.add_optimizer: expected a torch.optim.Optimizer (dopt's or torch's), "
                            f"got {type(optimizer).__module__}.{type(optimizer).__qualname__}")
        route = _route(optimizer)
        if route in ("zero", "consolidate"):
            if placement not in (None, "sharded"):
                raise _C.ValueError(f"dopt Checkpointer.add_optimizer: '{name}' is a ZeroRedundancyOptimizer, whose "
                                    f"state is sharded; leave placement out (got {placement!r})")
            self._check_zero_group(name, optimizer)
        if route == "fully_shard":
            if placement not in (None, "sharded"):
                raise _C.ValueError(f"dopt Checkpointer.add_optimizer: '{name}' is fully sharded; leave placement "
                                    f"out (got {placement!r})")
            self._check_zero_group(name, optimizer)
            self._c.add_sharded_units(name, optimizer._c)
            self._items.append(_ShardedUnitsState(name, optimizer))
        elif route == "zero":
            self._c.add_zero(name, optimizer._c)
            self._items.append(_DoptState(name, optimizer))
        elif route == "consolidate":
            self._add_python_state(name, optimizer, "replicated", consolidate=True)
        elif route == "post_local_sgd":
            if placement not in (None, "per_rank"):
                raise _C.ValueError(f"dopt Checkpointer.add_optimizer: '{name}' is a PostLocalSGDOptimizer, whose "
                                    f"state is each rank's own; leave placement out (got {placement!r})")
            self._add_python_state(name, optimizer, "per_rank", consolidate=False)
        elif route == "dopt":
            self._c.add_optimizer(name, optimizer._c, _placement(placement or "replicated", "add_optimizer"))
            self._items.append(_DoptState(name, optimizer))
        else:
            self._add_python_state(name, optimizer, _placement(placement or "replicated", "add_optimizer"),
                                   consolidate=False)

    def _check_zero_group(self, name, zero):
        group = getattr(zero, "dopt_group", None)
        ranks = group.ranks if group is not None else None
        if (ranks is not None and ranks != self._group.ranks) or zero.world_size != self.world_size:
            raise _C.ValueError(f"dopt Checkpointer.add_optimizer: the ZeroRedundancyOptimizer '{name}' runs over "
                                f"{zero.world_size} ranks{'' if ranks is None else ' ' + str(ranks)}, the "
                                f"Checkpointer over {self._group.ranks}; its process group must have the "
                                "Checkpointer's ranks (its files are named by rank)")

    def _add_python_state(self, name, obj, placement, consolidate):
        item = _PythonState(name, obj, placement, consolidate)
        self._c.add_tensors(name, {_BLOB: item.dt}, placement)
        self._items.append(item)

    def add_state(self, name, obj, placement="replicated"):
        """Any other object with ``state_dict()`` and ``load_state_dict()``
        (torch DCP's Stateful: an LR scheduler, a GradScaler, a data loader's
        state): its state dict, ``torch.save``d; "replicated" (rank 0's, loaded
        on every rank) or "per_rank"."""
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError("dopt Checkpointer.add_state: expected an object with state_dict() and "
                            f"load_state_dict(), got {type(obj).__module__}.{type(obj).__qualname__}")
        self._add_python_state(name, obj, _placement(placement, "add_state"), consolidate=False)

    def add_rng(self, name, generator, placement="per_rank"):
        """A ``torch.Generator`` (``torch.default_generator`` too): its whole
        state. "per_rank" by default (each rank's own draws; loads at the same
        world size only); "replicated" when every rank's is the same."""
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"dopt Checkpointer.add_rng: expected a torch.Generator, got {type(generator).__name__}")
        item = _Generator(name, generator)
        self._c.add_tensors(name, {"state": item.dt}, _placement(placement, "add_rng"))
        self._items.append(item)

    def add_extras(self, name, extras, placement="replicated"):
        """A dict of JSON values with string keys (a config, the epoch, a
        metric); a load replaces its contents in place."""
        if not isinstance(extras, collections.abc.MutableMapping):
            raise TypeError(f"dopt Checkpointer.add_extras: expected a dict, got {type(extras).__name__}")
        self._c.add_extras(name, _placement(placement, "add_extras"))
        self._items.append(_Extras(name, extras, self._c))

    # --- saving and loading (collectives) -------------------------------------------------
    def save(self, step):
        """Saves every item as checkpoint ``step`` and returns once it is
        committed on every rank."""
        self.save_async(step).wait()

    def save_async(self, step):
        """Snapshots every item into host memory and returns a future
        (``done()``, ``wait()``, ``result()``); the files are written and
        committed in the background. Waits first for the save still in flight."""
        step = self._step(step, "save")
        self.wait_snapshot()  # the items are refilled below
        done = False
        try:
            self._agree(self._each(lambda item: item.before_save(self)), "save", "nothing was saved")
            future = self._c.save_async(step)
            done = True
            return future
        finally:
            if done and self.background_snapshot:
                self._held = True  # the writer thread still reads them: released by wait_snapshot()
            else:
                self._release()  # the save copied what it needs

    def wait(self):
        """Waits for the save in flight, if any, and raises its error (local)."""
        self._c.wait()
        self._release_held()

    def wait_snapshot(self):
        """Returns once the save in flight no longer reads the registered
        objects (at once without ``background_snapshot`` or with no save in
        flight). With ``background_snapshot=True`` call it before anything
        that writes parameters or optimizer state after a ``save_async`` (an
        optimizer's ``step()``, your own writes); a forward pass and the
        gradients may go on meanwhile. Local; raises nothing (the snapshot's
        error is the save's, from its future)."""
        self._c.wait_snapshot()
        self._release_held()

    def _release_held(self):
        if self._held:
            self._held = False
            self._release()

    def _release(self):
        for item in self._items:
            item.release()

    def load(self, step):
        """Loads checkpoint ``step`` into the registered items."""
        step = self._step(step, "load")
        try:
            self._before_load(_step_folder(self.dir, step))
            self._c.load(step)
            self._after_load()
        finally:
            for item in self._items:
                item.release()

    def load_latest(self):
        """Loads the complete checkpoint of the highest step and returns its
        step, or None when there is none (a ``.tmp`` folder is incomplete)."""
        try:
            self._before_load(_latest_folder(self.dir))
            step = self._c.load_latest()
            if step is not None:
                self._after_load()
        finally:
            for item in self._items:
                item.release()
        return step

    # --- helpers ------------------------------------------------------------------------
    @staticmethod
    def _step(step, where):
        if isinstance(step, bool) or not isinstance(step, int):
            try:
                step = int(step.__index__())
            except AttributeError:
                raise TypeError(f"dopt Checkpointer.{where}: the step must be an int, got "
                                f"{type(step).__name__}") from None
        return step

    def _each(self, f):
        """Runs f on every item; the first error (raised after _agree)."""
        try:
            for item in self._items:
                f(item)
        except Exception as e:  # noqa: BLE001 (every rank must learn of it)
            return e
        return None

    def _agree(self, error, where, consequence):
        """Every rank learns whether the Python side failed on any rank (one
        small all-reduce on the group, in the order of the user's collectives)."""
        failed = torch.zeros(self.world_size, dtype=torch.int64)
        failed[self.rank] = error is not None
        self._group.all_reduce(failed, "sum")
        if error is not None:
            raise error
        bad = [r for r in range(self.world_size) if failed[r]]
        if bad:
            raise _C.Error(f"dopt Checkpointer.{where}: rank {bad[0]} failed (see its error); {consequence}")

    def _before_load(self, folder):
        self.wait_snapshot()  # before_load resizes the items a background snapshot may still read
        self._agree(self._each(lambda item: item.before_load(self, folder)), "load", "nothing was loaded")

    def _after_load(self):
        self._agree(self._each(lambda item: item.after_load()), "load",
                    "some items were loaded and others not: load again before training")

    def __repr__(self):
        return f"dopt.Checkpointer({self.dir!r}, rank {self.rank} of {self.world_size}, " \
               f"{len(self._items)} items)"
