"""ZeroRedundancyOptimizer for any torch.optim.Optimizer class: the user's
class steps this rank's shard; dopt partitions the parameters, broadcasts
each shard from its owner over a dopt group, runs torch's Join protocol and
consolidates the state. See dopt.zero for the public class.

The partition is torch's: each group's parameters by decreasing size, each
to the rank with the fewest elements so far (ties to the lower rank),
counting across the groups in order. So a rank owns the same parameters as
under torch's ZeroRedundancyOptimizer, and state dicts cross both ways.
"""
import copy
import io

import torch

from . import _C
from ._tensor import to_dopt
from .zero import ZeroRedundancyOptimizer


def _copy_to_device(value, device):
    """A copy of a (nested) state value with its tensors on ``device``;
    0-dim tensors (torch's ``step``) stay on the CPU."""
    if torch.is_tensor(value):
        if value.dim() == 0:
            return value.detach().clone().cpu()
        return value.detach().to(device, copy=True)
    if isinstance(value, dict):
        return {k: _copy_to_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_to_device(v, device) for v in value)
    return copy.deepcopy(value)


def _copy_groups_keys(src, dst):
    """Every key but 'params' from each group of src to the same group of dst."""
    for s, d in zip(src, dst):
        for k, v in s.items():
            if k != "params":
                d[k] = v


class _DoptViews:
    """dopt tensors over torch tensors' memory, made once per tensor object
    (a parameter, a bucket: never ``p.data``, a new object each time) while
    its memory stays the same, so that a step converts nothing."""

    def __init__(self):
        self._cache = {}

    def of(self, t):
        hit = self._cache.get(id(t))
        if hit is None or hit[0] is not t or hit[2] != t.data_ptr():
            hit = (t, to_dopt(t, requires_grad=False), t.data_ptr())
            self._cache[id(t)] = hit
        return hit[1]

    def clear(self):
        self._cache.clear()


class TorchStepZero(ZeroRedundancyOptimizer):
    """ZeroRedundancyOptimizer stepping its shard with the user's optimizer
    class (see the module docstring)."""

    uses_dopt_kernels = False

    def _init(self, items, optimizer_class, process_group, parameters_as_bucket_view, overlap_with_ddp, defaults):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError("dopt.ZeroRedundancyOptimizer: optimizer_class must be a torch.optim.Optimizer "
                            f"subclass (or a class dopt computes), got {optimizer_class!r}")
        self._all_params = [p for g in items for p in g["params"]] if isinstance(items[0], dict) else list(items)
        self.initialized = False
        torch.optim.Optimizer.__init__(self, items, defaults)  # fills self.param_groups (add_param_group below)
        self._common_init(process_group, parameters_as_bucket_view, overlap_with_ddp)
        self.rank = self._group.rank()
        self.world_size = self._group.size()
        self._optimizer_class = optimizer_class
        self._optim_defaults = dict(defaults)
        self._views = _DoptViews()
        self._partition = self._partition_parameters()
        self.optim = optimizer_class(self._partition[self.rank], **defaults)
        _copy_groups_keys(self.optim.param_groups, self.param_groups)
        self._trainable = self._trainable_mask()
        self._buckets = []
        self._build_buckets()
        self._all_state_dicts = []
        self.initialized = True

    # --- the partition -----------------------------------------------------------------
    def _partition_parameters(self):
        """Per rank, its parameter groups (copies of the global groups' dicts
        with that rank's parameters): torch's sorted greedy partition."""
        n = self.world_size
        out = [[] for _ in range(n)]
        sizes = [0] * n
        for group in self.param_groups:
            mine = [[] for _ in range(n)]
            for p in sorted(group["params"], key=lambda t: t.numel(), reverse=True):
                r = min(range(n), key=lambda i: sizes[i])
                mine[r].append(p)
                sizes[r] += p.numel()
            for r in range(n):
                d = dict(group)
                d["params"] = mine[r]
                out[r].append(d)
        return out

    def _owned_by(self, r):
        return [p for g in self._partition[r] for p in g["params"]]

    def _trainable_mask(self):
        return [p.requires_grad for p in self._all_params]

    def _build_buckets(self):
        """With parameters_as_bucket_view: per rank, one flat tensor holding
        that rank's trainable parameters (they become views of it), so that
        a shard travels in one broadcast; frozen ones get memory of their own."""
        self._buckets = []
        self._views.clear()
        if not self.parameters_as_bucket_view:
            return
        for r in range(self.world_size):
            params = self._owned_by(r)
            trainable = [p for p in params if p.requires_grad]
            for p in params:
                if not p.requires_grad:
                    p.data = p.data.detach().clone()
            if not trainable:
                self._buckets.append(None)
                continue
            dtypes = {p.dtype for p in trainable}
            devices = {p.device for p in trainable}
            if len(dtypes) > 1 or len(devices) > 1:  # one flat tensor needs one dtype and device
                self._buckets.append(None)
                continue
            bucket = torch.empty(sum(p.numel() for p in trainable), dtype=trainable[0].dtype,
                                 device=trainable[0].device)
            at = 0
            for p in trainable:
                bucket[at:at + p.numel()].copy_(p.data.flatten())
                p.data = bucket[at:at + p.numel()].view_as(p.data)
                at += p.numel()
            self._buckets.append(bucket)

    # --- step --------------------------------------------------------------------------
    def step(self, closure=None, **kwargs):
        """Collective: the local optimizer steps this rank's shard
        (``closure`` and ``kwargs`` go to its ``step``, as torch's ZeRO passes
        them), then every shard is broadcast from its owner. Returns what the
        local step returned."""
        self._notify_join()
        mask = self._trainable_mask()
        if mask != self._trainable:
            self._build_buckets()
            self._trainable = mask
        _copy_groups_keys(self.param_groups, self.optim.param_groups)
        if closure is None:
            loss = self.optim.step(**kwargs)
        else:
            loss = self.optim.step(closure=closure, **kwargs)
        self._sync_params()
        _copy_groups_keys(self.optim.param_groups, self.param_groups)
        return loss

    @torch.no_grad()
    def _sync_params(self):
        group = self._group.c
        for r in range(self.world_size):
            bucket = self._buckets[r] if self._buckets else None
            if bucket is not None:
                group.broadcast(self._views.of(bucket), r)
                others = [p for p in self._owned_by(r) if not p.requires_grad]
            else:
                others = self._owned_by(r)
            by_dtype = {}
            for p in others:
                by_dtype.setdefault((p.dtype, p.device), []).append(p)
            for params in by_dtype.values():
                self._broadcast_tensors(params, r)

    def _broadcast_tensors(self, params, src):
        """One broadcast_coalesced of ``params`` from ``src``: the parameters'
        own memory (their dopt views made once), a contiguous copy for a
        non-contiguous one."""
        views, copies = [], []
        for p in params:
            if p.is_contiguous():
                views.append(self._views.of(p))
            else:
                c = p.detach().contiguous()
                copies.append((p, c))
                views.append(to_dopt(c, requires_grad=False))
        self._group.c.broadcast_coalesced(views, src)
        for p, c in copies:
            p.data.copy_(c)

    # --- groups ------------------------------------------------------------------------
    def add_param_group(self, param_group):
        """Collective: every rank adds the same group. Before the constructor
        finishes, torch.optim.Optimizer's own (it fills param_groups)."""
        torch.optim.Optimizer.add_param_group(self, param_group)
        if not self.initialized:
            return
        self._all_params.extend(self.param_groups[-1]["params"])
        self._partition = self._partition_parameters()
        self.optim.add_param_group(self._partition[self.rank][-1])
        self._trainable = self._trainable_mask()
        self._build_buckets()

    # --- state dicts -------------------------------------------------------------------
    def consolidate_state_dict(self, to: int = 0):
        """Collective: every rank's local state dict, gathered on rank ``to``
        (kept on the CPU)."""
        _copy_groups_keys(self.param_groups, self.optim.param_groups)
        mine = self.optim.state_dict()
        self._all_state_dicts = []
        for r in range(self.world_size):
            if r == to:  # the target's own state travels nowhere
                sd = mine if self.rank == to else None
            else:
                sd = self._send_object(mine if self.rank == r else None, r)
            if self.rank == to:
                self._all_state_dicts.append(_copy_to_device(sd, torch.device("cpu")))

    def _send_object(self, obj, src):
        """Broadcasts a picklable object from ``src`` over the dopt group (torch.save's format)."""
        group = self._group.c
        length = torch.zeros(1, dtype=torch.int64)
        if self.rank == src:
            buf = io.BytesIO()
            torch.save(obj, buf)
            payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            length[0] = payload.numel()
        group.broadcast(to_dopt(length, requires_grad=False), src)
        if self.rank != src:
            payload = torch.empty(int(length[0]), dtype=torch.uint8)
        if int(length[0]) > 0:
            group.broadcast(to_dopt(payload, requires_grad=False), src)
        if self.rank == src:
            return obj
        return torch.load(io.BytesIO(payload.numpy().tobytes()), map_location="cpu")

    def state_dict(self):
        """torch's global layout, from the last consolidate_state_dict (on its
        target rank only; RuntimeError elsewhere, as torch)."""
        if not self._all_state_dicts:
            raise RuntimeError("Optimizer state has not been consolidated on this rank. Please call "
                               f"`consolidate_state_dict(to={self.rank})` on all ranks beforehand if you meant "
                               "to save the global state.")
        index = {}
        groups = []
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = []
            for p in g["params"]:
                index.setdefault(id(p), len(index))
                d["params"].append(index[id(p)])
            groups.append(d)
        state = {}
        for r, local in enumerate(self._all_state_dicts):
            owned = self._partition[r]
            if len(local["param_groups"]) != len(owned):
                raise _C.StateError(f"ZeroRedundancyOptimizer.state_dict: rank {r}'s local state has "
                                    f"{len(local['param_groups'])} groups, its partition {len(owned)}")
            for lg, og in zip(local["param_groups"], owned):
                for li, p in zip(lg["params"], og["params"]):
                    if li in local["state"]:
                        state[index[id(p)]] = local["state"][li]
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Loads a global state dict (torch's ZeRO's, a plain optimizer's or
        this class's): each rank keeps the state of the parameters it owns."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise _C.StateDictError("ZeroRedundancyOptimizer.load_state_dict: a state dict needs 'state' and "
                                    "'param_groups'")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise _C.StateDictError("ZeroRedundancyOptimizer.load_state_dict: the state dict has "
                                    f"{len(saved_groups)} parameter groups, the optimizer "
                                    f"{len(self.param_groups)}")
        for sg, g in zip(saved_groups, self.param_groups):
            if len(sg["params"]) != len(g["params"]):
                raise _C.StateDictError("ZeroRedundancyOptimizer.load_state_dict: a loaded parameter group "
                                        f"has {len(sg['params'])} parameters, the optimizer's "
                                        f"{len(g['params'])}")
        by_index = {}
        for sg, g in zip(saved_groups, self.param_groups):
            for i, p in zip(sg["params"], g["params"]):
                by_index[i] = p
        mine = {id(p) for p in self._owned_by(self.rank)}
        for i, value in state_dict["state"].items():
            p = by_index.get(i)
            if p is None:
                raise _C.StateDictError(f"ZeroRedundancyOptimizer.load_state_dict: state for parameter index {i}, "
                                        "which no group lists")
            if id(p) in mine and value is not None:
                self.optim.state[p] = _copy_to_device(value, p.device)
        _copy_groups_keys(saved_groups, self.param_groups)
        _copy_groups_keys(self.param_groups, self.optim.param_groups)

    # --- dopt's additions --------------------------------------------------------------
    def param_owners(self):
        """The owner rank of each parameter, by position in the groups."""
        owner = {}
        for r in range(self.world_size):
            for p in self._owned_by(r):
                owner[id(p)] = r
        return [owner[id(p)] for g in self.param_groups for p in g["params"]]

    def save_sharded(self, directory):
        raise _C.NotSupportedError("dopt.ZeroRedundancyOptimizer.save_sharded: dopt's sharded checkpoints hold the "
                                   "state of the classes dopt computes; with "
                                   f"{self._optimizer_class.__qualname__}, use consolidate_state_dict() and "
                                   "state_dict() (torch's layout)")

    load_sharded = save_sharded

    def __repr__(self):
        return f"dopt.ZeroRedundancyOptimizer({self._optimizer_class.__qualname__}, rank {self.rank} of " \
               f"{self.world_size})\n" + repr(self.optim)


TorchStepZero.__name__ = TorchStepZero.__qualname__ = "ZeroRedundancyOptimizer"
