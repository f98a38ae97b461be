"""torch tensors <-> dopt tensors without copies (DLPack), and the binding
of torch parameters to the dopt tensors that share their memory."""
import torch
from torch.utils import dlpack as _dlpack

from . import _C


def to_dopt(t, requires_grad=None):
    """A dopt tensor over the memory of torch tensor ``t`` (no copy).

    ``t`` must be dense and contiguous (dopt tensors are row-major without
    strides). The dopt tensor keeps ``t``'s storage alive."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"dopt: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise _C.ValueError(f"dopt: only dense tensors are supported, got layout {t.layout}")
    if not t.is_contiguous():
        raise _C.ValueError(
            f"dopt: the tensor of shape {tuple(t.shape)} is not contiguous (strides {t.stride()}); "
            "dopt shares memory with contiguous tensors only")
    rg = t.requires_grad if requires_grad is None else requires_grad
    return _C.from_dlpack(_dlpack.to_dlpack(t.detach()), rg)


def to_torch(d):
    """A torch tensor over the memory of dopt tensor ``d`` (no copy)."""
    return _dlpack.from_dlpack(d.to_dlpack())


class _Entry:
    __slots__ = ("param", "dt", "ptr", "gptr", "rg")


class ParamBinding:
    """The torch parameters an optimizer was given and, for each, the dopt
    tensor that shares its memory.

    ``sync()`` (before every step) carries over what torch may have changed
    since: a parameter whose ``.data`` was re-pointed, ``requires_grad``, and
    the gradients, which torch allocates (first backward) and may re-allocate
    (``zero_grad(set_to_none=True)``): the dopt gradient is a view of
    ``p.grad``'s memory, renewed only when that memory changes.

    ``rebind(dt)`` is dopt's hook after it re-pointed a parameter at memory
    it owns (ZeRO's bucket views): the torch parameter becomes a view of it,
    as torch's own ZeRO does with ``p.data = bucket_view``."""

    def __init__(self):
        self.entries = []
        self._by_param = {}
        self._by_key = {}

    def add(self, p):
        e = self._by_param.get(id(p))
        if e is not None:
            return e.dt
        if not isinstance(p, torch.Tensor):
            raise TypeError("optimizer can only optimize Tensors, but one of the params is " + torch.typename(p))
        e = _Entry()
        e.param = p
        e.dt = to_dopt(p)
        e.ptr = p.data_ptr()
        e.gptr = None
        e.rg = p.requires_grad
        self.entries.append(e)
        self._by_param[id(p)] = e
        self._by_key[e.dt.key] = e
        return e.dt

    def truncate(self, n):
        """Forgets the parameters added after the first n (a failed add)."""
        for e in self.entries[n:]:
            del self._by_param[id(e.param)]
            del self._by_key[e.dt.key]
        del self.entries[n:]

    def dopt(self, p):
        return self._by_param[id(p)].dt

    def __contains__(self, p):
        return id(p) in self._by_param

    def param_of(self, dt):
        return self._by_key[dt.key].param

    def sync(self, where="step"):
        for i, e in enumerate(self.entries):
            p = e.param
            ptr = p.data_ptr()
            if ptr != e.ptr:
                e.dt.set_data(to_dopt(p.data, requires_grad=e.rg))
                e.ptr = ptr
            rg = p.requires_grad
            if rg != e.rg:
                e.dt.requires_grad = rg
                e.rg = rg
            g = p.grad
            if g is None:
                if e.gptr is not None:
                    e.dt.set_grad(None)
                    e.gptr = None
            else:
                if g.layout != torch.strided:
                    raise _C.NotSupportedError(
                        f"dopt {where}: parameter {i} (shape {tuple(p.shape)}) has a {g.layout} gradient; dopt's "
                        "kernels take dense gradients (nn.Embedding(sparse=True) makes sparse ones: use "
                        "sparse=False, or torch's optimizer)")
                gptr = g.data_ptr()
                if gptr != e.gptr:
                    e.dt.set_grad(to_dopt(g, requires_grad=False))
                    e.gptr = gptr

    def rebind(self, dt):
        e = self._by_key[dt.key]
        with torch.no_grad():
            e.param.data = to_torch(dt)
        e.ptr = e.param.data_ptr()
