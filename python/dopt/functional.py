"""as_functional_optim and functional_optim_map: torch.distributed.optim's
functional optimizers (torch.distributed.optim.utils), computed by dopt.

``functional_optim_map`` maps torch.optim's classes to dopt's functional
classes, constructed as torch's are: ``cls(params, *args, **kwargs,
_allow_empty_param_list=True)``; ``register_functional_optim(key, cls)``
adds one of your own, as torch's does."""
import torch

from . import _C
from ._groups import bind_arguments, resolve_optimizer_class, split_hyperparams
from ._tensor import to_dopt, to_torch

__all__ = ["FunctionalOptimizer", "as_functional_optim", "functional_optim_map", "register_functional_optim"]


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


def _functional_class(name):
    """dopt's functional class for the optimizer ``name``, with the
    constructor of torch's functional classes."""

    def __init__(self, params, *args, _allow_empty_param_list=False, **kwargs):
        _, torch_cls = resolve_optimizer_class(name)
        hp = bind_arguments(name, torch_cls, args, kwargs)
        ours, _ = split_hyperparams(name, torch_cls, hp, f"functional {name}")
        params = list(params)
        if not params and not _allow_empty_param_list:
            raise _C.ValueError("optimizer got an empty parameter list")
        FunctionalOptimizer.__init__(self, name, params, ours)

    return type(f"Functional{name}", (FunctionalOptimizer,),
                {"__init__": __init__, "__module__": __name__,
                 "__doc__": f"torch's functional {name} (step_param / step), computed by dopt."})


functional_optim_map = {}
for _name in ("Adagrad", "Adam", "AdamW", "SGD", "Adadelta", "RMSprop", "Rprop", "Adamax"):
    _torch_cls = getattr(torch.optim, _name)
    functional_optim_map[_torch_cls] = _functional_class(_name)
    globals()[f"Functional{_name}"] = functional_optim_map[_torch_cls]


def register_functional_optim(key, optim):
    """Adds ``optim`` (any class, built as ``optim(params, *args, **kwargs,
    _allow_empty_param_list=True)``) under ``key``, unless the key is taken."""
    if key not in functional_optim_map:
        functional_optim_map[key] = optim


def as_functional_optim(optim_cls, *args, **kwargs):
    """The functional form of ``optim_cls`` without parameters, for
    ``step_param``: dopt's for the classes dopt computes (torch.optim.Adam, a
    dopt.optim class, a name), else what ``register_functional_optim`` gave
    for that key."""
    if optim_cls in functional_optim_map and not isinstance(optim_cls, str):
        return functional_optim_map[optim_cls]([], *args, **kwargs, _allow_empty_param_list=True)
    name, _ = resolve_optimizer_class(optim_cls)
    return functional_optim_map[getattr(torch.optim, name)]([], *args, **kwargs, _allow_empty_param_list=True)
