"""dopt.DistributedOptimizer: torch.distributed.optim.DistributedOptimizer over dopt's RPC."""
from . import _C
from . import rpc as _rpc
from ._groups import bind_arguments, resolve_optimizer_class, split_hyperparams

__all__ = ["DistributedOptimizer"]


class DistributedOptimizer:
    """``DistributedOptimizer(optimizer_class, params_rref, *args, **kwargs)``:
    one functional optimizer per owner of the parameters (``dopt.rpc.RRef``s
    to tensors), built on every owner; ``step(context)`` applies, on every
    owner at once, the gradients deposited in the context (a
    ``dopt.rpc.GradContext`` or its id). Results equal the torch.optim
    class applying the same gradients, bit for bit."""

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        name, torch_cls = resolve_optimizer_class(optimizer_class)
        ours, _ = split_hyperparams(name, torch_cls, bind_arguments(name, torch_cls, args, kwargs),
                                    "DistributedOptimizer")
        refs = [r._c for r in params_rref]
        self._c = _C.rpc.DistributedOptimizer(_rpc._require_agent("DistributedOptimizer"), name, ours, refs)

    def step(self, context_id):
        """Collective over the owners: waits for the context's deposits, then one message per owner."""
        if isinstance(context_id, _rpc.GradContext):
            context_id.wait_deposits()
            context_id = context_id.id
        self._c.step(int(context_id))

    def set_lr(self, lr):
        """dopt only: the learning rate of every owner's optimizer."""
        self._c.set_lr(float(lr))

    def lrs(self):
        return list(self._c.lrs())
