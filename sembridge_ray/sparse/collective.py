"""What the training maths needs from a process group, behind a two-method interface.

The loop and the losses call ``gather`` and ``mean``; they never import ``torch.distributed``. A
single process uses :class:`LocalCollective`; DDP workers (Ray Train sets up the process group) use
:class:`TorchCollective`."""

from __future__ import annotations

from typing import Protocol

import torch


class Collective(Protocol):
    rank: int
    world: int

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """(b, ...) on each worker -> (world · b, ...) in rank order; gradients flow back to each
        local shard."""
        ...

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise mean over workers (no gradient): for logging."""
        ...


class LocalCollective:
    """One process: the local batch is the global batch."""

    rank, world = 0, 1

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach()


class TorchCollective:
    """The default ``torch.distributed`` process group (gloo on CPU, nccl on GPU)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        from torch.distributed.nn.functional import all_gather

        # The autograd-aware all_gather: its backward sums every worker's gradient for this shard (a
        # reduce-scatter), so the local encoder receives the gradient of every worker's loss.
        return torch.cat(all_gather(tensor.contiguous()), dim=0)

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        out = tensor.detach().clone()
        dist.all_reduce(out)
        return out / self.world
