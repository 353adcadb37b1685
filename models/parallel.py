"""Data-parallel training of a :class:`~layers.Network` across the ranks of a gang job (``ps=1 --ranks N``).

Every rank holds the whole network and walks the same shuffled batches (one RNG, seeded alike, drawing
the same input noise for the whole batch); each computes the gradient of its contiguous share of every
batch, weighted by that share, and pushes it into the network's :class:`~variables.PSVariable`. The
update adds the shares in rank order where each part of the weights lives, with the optimizer's slots
there too, and every rank pulls the new weights. A 1-rank run and an N-rank run thus see the same batches
and the same noise, and differ only in how a batch's gradient is summed.

Whatever decides the course of training is agreed: the batch losses, the validation metrics (each rank
measures its share of the validation set) and a stop asked of any rank are summed over the ranks each time
(:class:`~variables.Tally`), so early stopping, learning-rate decay and stops happen at the same step
everywhere. Rank 0 alone writes checkpoints and weights and reports; every rank resumes from its
checkpoint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jobman.dispatch.channel import Channel

from .layers import Network
from .optim import Optimizer
from .variables import PSVariable, Tally


def share(n: int, rank: int, ranks: int) -> tuple[int, int]:
    """The rows ``(first, end)`` of a batch of ``n`` that are ``rank``'s: as even as can be, larger first."""
    base, extra = divmod(n, ranks)
    first = rank * base + min(rank, extra)
    return first, first + base + (1 if rank < extra else 0)


def gang_of(channel: Channel) -> Any:
    """``jobman.ps`` for a ``ps=1`` job, or one sentence on why this job cannot train that way."""
    if channel.world_size < 2:
        raise ValueError("ps=1 trains across the ranks of one job: schedule it with --ranks 2 or more")
    return channel.parameter_server()


class AgreedStop:
    """The channel as the loop sees it in a gang: ``should_stop`` is true once any rank was asked to stop,
    as the last :meth:`DataParallel.step` agreed, so every rank ends at the same step."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.agreed = False

    def should_stop(self) -> bool:
        return self.agreed

    @property
    def stop_reason(self) -> str | None:
        return self._channel.stop_reason or ("stop requested of another rank" if self.agreed else None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


class DataParallel:
    """The network's weights in the parameter server, and the steps every rank takes alike."""

    def __init__(self, ps: Any, net: Network, updater: Optimizer, channel: Channel) -> None:
        self.ps, self.net, self.updater = ps, net, updater
        self.rank, self.ranks = ps.worker_id(), ps.num_workers()
        shapes = {k: v.shape for k, v in net.params.items()}
        self.var = PSVariable(ps, shapes, type(updater).slot_names, net.flat_params.dtype, value=net.flat_params)
        self.var.init(net.params)
        self.tally = Tally(ps, 2)
        self.stop = AgreedStop(channel)
        self._channel = channel

    def step(self, x: np.ndarray, y: np.ndarray, n: int) -> float:
        """One step on this rank's share ``x, y`` of a batch of ``n``: the batch's mean loss, summed over ranks."""
        weight = len(y) / n
        if len(y):
            loss = self.net.loss_and_grads(x, y)
            self.net.flat_grads *= np.float32(weight) if self.net.flat_grads.dtype == np.float32 else weight
        else:  # a batch smaller than the gang: nothing to add
            loss = 0.0
            self.net.flat_grads[...] = 0
        self.tally.put([loss * weight, float(self._channel.should_stop())])
        self.var.push(self.net.flat_grads)
        self.updater.begin_step()
        self.var.update(self.updater)
        self.var.pull()
        total, votes = self.tally.sums()
        self.stop.agreed = self.stop.agreed or votes > 0
        return float(total)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float | None, float | None]:
        """(error, mean loss) on a set, each rank measuring its share: collective."""
        if len(y) == 0:
            return None, None
        first, end = share(len(y), self.rank, self.ranks)
        error, loss = self.net.evaluate(x[first:end], y[first:end])
        n = end - first
        wrong, total = self.tally.reduce([round((error or 0.0) * n), (loss or 0.0) * n])
        return float(wrong) / len(y), float(total) / len(y)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The weights with their slots, as the parameter server holds them (a checkpoint's ``net``)."""
        return self.var.save(slots=True)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Collective: every rank writes its part from the checkpoint, and has the whole in its network."""
        self.var.load(arrays)

    def release(self) -> None:
        self.var.release()
