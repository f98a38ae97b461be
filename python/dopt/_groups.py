"""Optimizer classes, hyperparameters, parameter groups and state dicts in
torch's layout, shared by the local optimizers and ZeroRedundancyOptimizer."""
import inspect

import torch
import torch.optim.optimizer as _torch_optimizer_module

from . import _C
from ._tensor import ParamBinding, to_dopt, to_torch

# torch.optim classes whose `step` state is a Python int (dopt keeps an int64 0-d tensor).
_INT_STEP = {"RMSprop", "Adadelta", "Rprop"}
_KEYS = {}
_REQUIRED = _torch_optimizer_module.required


def registered_optimizers():
    """Names of dopt's optimizers (torch.optim's class names)."""
    return list(_C.registered_optimizers())


def _functional_classes():
    """torch's functional optimizer classes (torch.distributed.optim's _FunctionalAdam & co.) by name."""
    try:
        from torch.distributed.optim.utils import functional_optim_map
    except ImportError:
        return {}
    return {c.__name__[len("_Functional"):]: c for c in functional_optim_map.values()
            if isinstance(c, type) and c.__name__.startswith("_Functional")}


def kernel_name(optimizer_class):
    """dopt's name for ``optimizer_class`` when dopt computes exactly that
    class (torch.optim's class itself, not a subclass; torch's functional
    class; a dopt.optim class; a name dopt knows), else None."""
    from . import optim as _optim
    known = registered_optimizers()
    if isinstance(optimizer_class, str):
        lower = {k.lower(): k for k in known}
        return lower.get(optimizer_class.lower())
    if not isinstance(optimizer_class, type):
        return None
    if issubclass(optimizer_class, _optim.Optimizer):
        return optimizer_class._dopt_name
    name = optimizer_class.__name__
    if name.startswith("_Functional"):
        name = name[len("_Functional"):]
        return name if name in known and _functional_classes().get(name) is optimizer_class else None
    return name if name in known and getattr(torch.optim, name, None) is optimizer_class else None


def resolve_optimizer_class(optimizer_class):
    """(dopt name, torch.optim class or None) for a class or name dopt
    computes (see kernel_name); ValueError naming the known ones otherwise."""
    if not (isinstance(optimizer_class, (str, type))):
        raise TypeError("optimizer_class must be a torch.optim class, a dopt.optim class or a name, got "
                        + type(optimizer_class).__name__)
    name = kernel_name(optimizer_class)
    if name is None:
        shown = optimizer_class if isinstance(optimizer_class, str) else optimizer_class.__qualname__
        raise _C.ValueError(f"dopt has no optimizer '{shown}' (dopt computes: {', '.join(registered_optimizers())})")
    torch_cls = getattr(torch.optim, name, None)
    if not (isinstance(torch_cls, type) and issubclass(torch_cls, torch.optim.Optimizer)):
        torch_cls = None
    return name, torch_cls


def kernels_compute(optimizer_class, defaults, groups):
    """Whether dopt's kernels can run ``optimizer_class`` with ``defaults``
    over ``groups`` (params as torch.optim takes them) exactly as torch would:
    a class dopt computes, no torch-only option away from its default
    (foreach=True, ...), contiguous floating-point dense parameters only. A name or a
    dopt.optim class always takes the kernels (there is no torch class to
    fall back to)."""
    if isinstance(optimizer_class, str) or (isinstance(optimizer_class, type) and
                                            issubclass(optimizer_class, _dopt_optimizer_base())):
        return True
    name = kernel_name(optimizer_class)
    if name is None:
        return False
    torch_cls = getattr(torch.optim, name, None)
    group_options = [dict(defaults)]
    tensors = []
    for g in groups:
        if isinstance(g, dict):
            group_options.append({k: v for k, v in g.items() if k != "params"})
            ps = g.get("params", [])
            tensors.extend([ps] if isinstance(ps, torch.Tensor) else list(ps))
        else:
            tensors.append(g)
    for options in group_options:
        try:
            split_hyperparams(name, torch_cls, options, "ZeroRedundancyOptimizer")
        except _C.NotSupportedError:
            return False
    return all(not isinstance(t, torch.Tensor) or (t.is_floating_point() and t.is_contiguous()) for t in tensors)


def _dopt_optimizer_base():
    from . import optim as _optim
    return _optim.Optimizer


def dopt_keys(name):
    """The hyperparameter names dopt's `name` has (torch's names)."""
    keys = _KEYS.get(name)
    if keys is None:
        try:
            keys = frozenset(_C.optimizer_hyperparams(name, {}))
        except _C.ValueError:  # SGD: lr is required
            keys = frozenset(_C.optimizer_hyperparams(name, {"lr": 1.0}))
        _KEYS[name] = keys
    return keys


def torch_only_defaults(name, torch_cls):
    """torch's constructor arguments that dopt does not have (foreach,
    capturable, differentiable, fused, ...) with torch's defaults."""
    if torch_cls is None:
        return {}
    out = {}
    for k, p in inspect.signature(torch_cls.__init__).parameters.items():
        if k in ("self", "params") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or k in dopt_keys(name):
            continue
        out[k] = p.default
    return out


def bind_arguments(name, torch_cls, args, kwargs):
    """Keyword hyperparameters from torch-style positional + keyword arguments."""
    if not args:
        return dict(kwargs)
    if torch_cls is None:
        raise TypeError(f"dopt {name}: pass hyperparameters by keyword")
    sig = inspect.signature(torch_cls.__init__)
    bound = sig.bind_partial(None, None, *args, **kwargs)
    out = dict(bound.arguments)
    out.pop("self", None)
    out.pop("params", None)
    return out


def split_hyperparams(name, torch_cls, hp, where, keep_unknown=False):
    """(dopt's hyperparameters, the others). A torch-only argument with a
    value other than torch's default is refused: dopt runs torch's
    single-tensor CPU arithmetic and has nothing to switch. A key neither
    dopt nor torch's class knows goes to dopt (which names it in its error)
    unless ``keep_unknown``: a parameter group's own keys (a name, a
    scheduler's ``initial_lr``) are kept in the group as torch keeps them."""
    keys = dopt_keys(name)
    extra = torch_only_defaults(name, torch_cls)
    ours, theirs = {}, {}
    for k, v in hp.items():
        if k in keys:
            if v is not None and v is not _REQUIRED:
                ours[k] = v
        elif k in extra:
            if v is not None and v is not False and v != extra[k]:
                raise _C.NotSupportedError(
                    f"dopt {where}: {name}({k}={v!r}) is not supported (dopt computes torch's single-tensor "
                    f"arithmetic; leave {k} at {extra[k]!r})")
            theirs[k] = v
        elif keep_unknown:
            theirs[k] = v
        else:
            ours[k] = v  # dopt names the unknown key
    return ours, theirs


def zero_grads(param_groups, set_to_none):
    """torch.optim.Optimizer.zero_grad's work over ``param_groups``."""
    for group in param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()


def refuse_duplicates(tensors, where):
    """A parameter listed twice (in one group or in two) is refused, naming
    it: torch 1.13 steps such a parameter twice per step (with a warning),
    dopt does not copy that (docs/torch-differences.md)."""
    seen = {}
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            continue
        j = seen.setdefault(id(t), i)
        if j != i:
            raise _C.ValueError(f"dopt {where}: parameter {i} (shape {tuple(t.shape)}, {t.dtype}) is the same "
                                f"tensor as parameter {j}; list each parameter once (torch would step it twice)")


def normalise_groups(params):
    """torch.optim.Optimizer's reading of `params`: a list of group dicts."""
    if isinstance(params, torch.Tensor):
        raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                        "but got " + torch.typename(params))
    groups = list(params)
    if len(groups) == 0:
        raise _C.ValueError("optimizer got an empty parameter list")
    if not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    return [normalise_group(g) for g in groups]


def normalise_group(group):
    if not isinstance(group, dict):
        raise TypeError("param group must be a dict")
    group = dict(group)
    params = group["params"]
    if isinstance(params, torch.Tensor):
        params = [params]
    elif isinstance(params, set):
        raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering of "
                        "tensors in sets will change between runs. Please use a list instead.")
    group["params"] = list(params)
    for p in group["params"]:
        if not isinstance(p, torch.Tensor):
            raise TypeError("optimizer can only optimize Tensors, but one of the params is " + torch.typename(p))
    return group


def state_value_to_torch(name, key, t):
    x = to_torch(t)
    if key == "step" and name in _INT_STEP and x.dim() == 0 and not x.is_floating_point():
        return int(x)
    return x


def state_value_to_dopt(v):
    if torch.is_tensor(v):
        return to_dopt(v.detach().contiguous(), requires_grad=False)
    if isinstance(v, bool):
        raise TypeError("dopt: a bool optimizer state value is not supported")
    if isinstance(v, int):
        return to_dopt(torch.tensor(v, dtype=torch.int64), requires_grad=False)
    if isinstance(v, float):
        return to_dopt(torch.tensor(v, dtype=torch.float64), requires_grad=False)
    raise TypeError(f"dopt: an optimizer state value of type {type(v).__name__} is not supported")


class GroupedOptimizer(torch.optim.Optimizer):
    """What dopt's local optimizers and ZeroRedundancyOptimizer share: torch
    parameter groups as dicts (so LR schedulers work), the torch <-> dopt
    parameter binding, the hyperparameters pushed to C++ before each step,
    and state dicts in torch's layout.

    torch.optim.Optimizer.__init__ is not called: the state lives in C++."""

    def _setup(self, name, torch_cls, params, defaults, where):
        self._name = name
        self._torch_cls = torch_cls
        self._where = where
        ours, theirs = split_hyperparams(name, torch_cls, defaults, where)
        self._dopt_defaults = ours
        self._keys = dopt_keys(name)
        full = dict(torch_only_defaults(name, torch_cls))
        full.update(theirs)
        try:
            full.update(_C.optimizer_hyperparams(name, ours))
        except _C.ValueError:
            if "lr" in ours:
                raise
            full.update(_C.optimizer_hyperparams(name, dict(ours, lr=1.0)))
            full["lr"] = _REQUIRED
        self.defaults = full
        self.param_groups = []
        self._synced = []
        self._binding = ParamBinding()
        self._stepped = []          # per group: the positions of the parameters dopt steps (floating point)
        self._skips_some = False    # whether some parameter is not floating point
        self._hooks_init()
        prepared = [self._prepare_group(g) for g in normalise_groups(params)]
        if self.defaults.get("lr") is _REQUIRED:
            # torch.optim.SGD(groups) with an lr in every group: dopt's spec needs a default lr
            # for the C++ side; every group overrides it.
            self._dopt_defaults = dict(self._dopt_defaults, lr=self.param_groups[0]["lr"])
        return prepared

    def _hooks_init(self):
        self._zero_grad_profile_name = f"Optimizer.zero_grad#{type(self).__name__}.zero_grad"

    def _prepare_group(self, group):
        """(dopt tensors, overrides for C++ or None); appends the Python dict."""
        ours, theirs = split_hyperparams(self._name, self._torch_cls,
                                         {k: v for k, v in group.items() if k != "params"}, self._where,
                                         keep_unknown=True)
        fill = getattr(self, "_group_defaults", self.defaults)
        if fill.get("lr") is _REQUIRED and "lr" not in ours:
            raise _C.ValueError("parameter group didn't specify a value of required optimization parameter lr")
        params = list(group["params"])
        refuse_duplicates(params, self._where)
        for i, p in enumerate(params):
            if p in self._binding:
                raise _C.ValueError(f"dopt {self._where}: some parameters appear in more than one parameter group "
                                    f"(parameter {i} of group {len(self.param_groups)}, shape {tuple(p.shape)})")
        # Non-floating tensors (an int64 buffer among a module's parameters)
        # stay in the group, as torch keeps them, and are never stepped
        # (they cannot have a gradient): dopt's C++ optimizer does not see them.
        stepped = [p for p in params if p.is_floating_point()]
        for i, p in enumerate(params):
            if p.is_floating_point() and not p.is_contiguous():
                raise _C.ValueError(
                    f"dopt {self._where}: parameter {i} of group {len(self.param_groups)} (shape {tuple(p.shape)}, "
                    f"strides {p.stride()}) is not contiguous (channels_last, a transposed view?); dopt's kernels "
                    "step parameters in place in contiguous memory. Make it contiguous "
                    "(model.to(memory_format=torch.contiguous_format)), or use torch's optimizer (dopt's ZeRO and "
                    "PostLocalSGDOptimizer take it as it is)")
        if len(stepped) != len(params):
            self._skips_some = True
        self._stepped.append([i for i, p in enumerate(params) if p.is_floating_point()])
        dts = [self._binding.add(p) for p in stepped]
        d = dict(fill)
        d.update(theirs)
        d.update(ours)
        d["params"] = params
        self.param_groups.append(d)
        self._synced.append(None)
        return dts, (ours if ours else None)

    def _add_group(self, param_group, before_add=None):
        """add_param_group for both dopt optimizers: the Python dict and the C++
        group, or neither (a failed add leaves nothing behind). ``before_add``
        runs after the group was checked, before C++ takes it."""
        n_params, n_groups = len(self._binding.entries), len(self.param_groups)
        try:
            dts, overrides = self._prepare_group(normalise_group(param_group))
            if before_add is not None:
                before_add(n_groups)
            self._c.add_param_group(dts, overrides)
        except BaseException:
            self._binding.truncate(n_params)
            del self.param_groups[n_groups:]
            del self._synced[n_groups:]
            del self._stepped[n_groups:]
            raise
        hp = self._c.group_hyperparams(n_groups)
        self.param_groups[-1].update(hp)
        self._synced[-1] = dict(hp)

    def _kernel_step(self, closure):
        """The closure's loss, then the step in C++ with the current hyperparameters and gradients."""
        loss = self._closure_loss(closure)
        self._push_hyperparams()
        self._binding.sync(f"{self._where}.step")
        self._c.step()
        return loss

    def _torch_state(self, state_of):
        """{parameter: {name: torch tensor}} over dopt's state memory, from ``state_of(dopt tensor)``."""
        out = {}
        for e in self._binding.entries:
            st = state_of(e.dt)
            if st:
                out[e.param] = {k: to_torch(v) for k, v in st.items()}
        return out

    def _after_groups_built(self, c):
        """Fills the Python group dicts from C++ (every dopt key, validated)."""
        self._c = c
        for i, d in enumerate(self.param_groups):
            hp = c.group_hyperparams(i)
            d.update(hp)
            self._synced[i] = dict(hp)

    def _push_hyperparams(self):
        c = self._c
        for i, d in enumerate(self.param_groups):
            last = self._synced[i]
            changed = {}
            for k in self._keys:
                v = d.get(k)
                if v is None:
                    continue
                if isinstance(v, list):
                    v = tuple(v)
                if v != last.get(k):
                    changed[k] = v
            if changed:
                c.set_group_hyperparams(i, changed)
                last.update(changed)

    def _pull_hyperparams(self):
        for i, d in enumerate(self.param_groups):
            hp = self._c.group_hyperparams(i)
            d.update(hp)
            self._synced[i] = dict(hp)

    def zero_grad(self, set_to_none: bool = False):
        """torch.optim.Optimizer.zero_grad over every parameter (the gradients are torch's)."""
        zero_grads(self.param_groups, set_to_none)

    def _closure_loss(self, closure):
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def _index_maps(self):
        """(dopt's index -> torch's, torch's -> dopt's) over all groups: they
        differ where non-floating parameters (not stepped) are skipped."""
        to_torch_index, to_dopt_index, at = [], {}, 0
        for g, stepped in zip(self.param_groups, self._stepped):
            for pos in stepped:
                to_dopt_index[at + pos] = len(to_torch_index)
                to_torch_index.append(at + pos)
            at += len(g["params"])
        return to_torch_index, to_dopt_index

    def _torch_layout(self, sd):
        """A state dict from C++ (dopt tensors) in torch's layout (torch tensors)."""
        if self._skips_some:
            return self._torch_layout_skipping(sd)
        state = {}
        for idx, st in sd["state"].items():
            state[int(idx)] = {k: state_value_to_torch(self._name, k, t) for k, t in st.items()}
        groups = []
        for i, g in enumerate(sd["param_groups"]):
            d = {k: v for k, v in self.param_groups[i].items() if k != "params"} if i < len(self.param_groups) else {}
            for k, v in g.items():
                if k != "params":
                    d[k] = v
            if d.get("lr") is _REQUIRED:
                d.pop("lr")
            d["params"] = list(g["params"])
            groups.append(d)
        return {"state": state, "param_groups": groups}

    def _torch_layout_skipping(self, sd):
        """_torch_layout with non-floating parameters: torch's numbering counts them."""
        to_torch_index, _ = self._index_maps()
        plain = dict(sd, state={to_torch_index[int(i)]: st for i, st in sd["state"].items()})
        self._skips_some = False
        try:
            out = self._torch_layout(plain)
        finally:
            self._skips_some = True
        at = 0
        for d, g in zip(out["param_groups"], self.param_groups):
            d["params"] = list(range(at, at + len(g["params"])))
            at += len(g["params"])
        return out

    def _dopt_layout(self, state_dict):
        """torch's layout -> the C++ form (dopt tensors; dopt's keys only)."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise _C.StateDictError(f"{self._where}.load_state_dict: a state dict needs 'state' and 'param_groups'")
        if self._skips_some:
            state_dict = self._without_skipped(state_dict)
        state = {}
        for idx, st in state_dict["state"].items():
            if st is None:
                continue
            state[int(idx)] = {k: state_value_to_dopt(v) for k, v in st.items() if v is not None}
        groups = []
        for g in state_dict["param_groups"]:
            d = {k: v for k, v in g.items() if k in self._keys}
            d["params"] = [int(i) for i in g["params"]]
            groups.append(d)
        return {"state": state, "param_groups": groups, "metadata": {}}

    def _without_skipped(self, state_dict):
        """A loaded state dict (torch's numbering, non-floating parameters
        counted) in dopt's numbering, matched by position in each group."""
        _, to_dopt_index = self._index_maps()
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(saved, self.param_groups)):
            raise _C.StateDictError(f"{self._where}.load_state_dict: the state dict's parameter groups do not "
                                    "match the optimizer's (number of groups or of parameters in a group)")
        mine, at = {}, 0
        for s, g in zip(saved, self.param_groups):
            for pos, idx in enumerate(s["params"]):
                if at + pos in to_dopt_index:
                    mine[int(idx)] = to_dopt_index[at + pos]
            at += len(g["params"])
        groups = []
        for s, stepped in zip(saved, self._stepped):
            d = dict(s)
            d["params"] = [mine[int(s["params"][pos])] for pos in stepped]
            groups.append(d)
        state = {mine[int(i)]: st for i, st in state_dict["state"].items() if int(i) in mine}
        return {"state": state, "param_groups": groups}

    def _adopt_groups(self, state_dict):
        """After a load: every key of the loaded groups (torch's extras too)."""
        for d, g in zip(self.param_groups, state_dict["param_groups"]):
            for k, v in g.items():
                if k != "params" and k not in self._keys:
                    d[k] = v
        self._pull_hyperparams()

    def __getstate__(self):
        raise TypeError(f"{type(self).__name__} cannot be pickled; save its state_dict()")

    def __repr__(self):
        lines = [type(self).__name__ + " ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(g):
                if k != "params":
                    lines.append(f"    {k}: {g[k]}")
        lines.append(")")
        return "\n".join(lines)
