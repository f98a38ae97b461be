"""dopt: distributed optimizers for PyTorch users, computed by dopt's C++ core.

Change the import, keep the training script::

    from torch.distributed.optim import ZeroRedundancyOptimizer   # before
    from dopt import ZeroRedundancyOptimizer                      # after

The optimizers take torch tensors and update them in place (dopt shares
their memory through DLPack). Process groups come from the launcher's
environment (torchrun, dopt-run, mpirun, srun); see dopt.distributed for how
dopt's rendezvous stays clear of torch's MASTER_PORT.
"""
from . import _C
from ._C import (Error, ValueError, TypeError, KeyError, StateError, StateDictError, NotSupportedError,  # noqa: A004
                 TimeoutError, CollectiveMismatchError, PeerLostError, IOError, ShapeError, DTypeError)
from ._groups import registered_optimizers
from ._tensor import to_dopt, to_torch
from .distributed import (ProcessGroup, init_process_group, is_initialized, get_world, get_rank,
                          get_world_size, new_group, new_subgroups, destroy_process_group)
from . import optim
from . import averagers
from . import averagers as hierarchical_model_averager
from .zero import ZeroRedundancyOptimizer
from .fully_shard import fully_shard, FullyShardedOptimizer
from .post_local_sgd import PostLocalSGDOptimizer
from .functional import as_functional_optim
from . import rpc
from .distributed_optimizer import DistributedOptimizer
from .checkpoint import Checkpointer

__version__ = "0.1.0"

__all__ = ["ZeroRedundancyOptimizer", "fully_shard", "FullyShardedOptimizer", "PostLocalSGDOptimizer", "DistributedOptimizer", "as_functional_optim",
           "Checkpointer", "optim", "averagers", "rpc", "init_process_group", "is_initialized", "get_world", "get_rank",
           "get_world_size", "new_group", "new_subgroups", "destroy_process_group", "ProcessGroup",
           "registered_optimizers", "to_dopt", "to_torch", "Error"]
