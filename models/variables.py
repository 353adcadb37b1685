"""Variables, as mlcore has them: weights with their updater's slots, living here or in the parameter server.

A variable is a vector or matrix (or several laid end to end, named, as a network's parameters are) with
one slot array per piece of its updater's state (momentum's velocity, Adam's moments). Its life:

- created (``LocalVariable(shapes, slot_names)``, or ``PSVariable(...)`` by every rank of a gang alike),
- initialised (``init(values)``) or loaded (``load(arrays)``, from what ``save`` gave),
- pulled (``pull()``: the current values into this process's copy, ``value`` and its named ``views``),
- pushed a gradient (``push(grad)``; pushes add up until the next update),
- updated (``update(updater)``: one step of a :class:`~jobman.models.optim.Optimizer` on the pushed sum,
  the slots updated where the variable lives; the caller counts the step once, ``updater.begin_step()``),
- saved with or without its slots (``save(slots=True)``; a checkpoint is with), and released.

A :class:`PSVariable` lives in ``jobman.ps`` tables, reached through ``channel.parameter_server()``, split
over the ranks. Each rank pushes into a gradient table of its own, so the rank that holds a part of the
values adds the ranks' gradients in rank order: the sum, hence every step, is the same in every run, and a
resumed run matches one never stopped bit for bit (one table summing every rank's adds would add in
arrival order, and floating-point addition is not associative). That rank then steps its part of the
values and of the slots in place; every rank pulls the whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np

from .buffers import views_of
from .optim import Optimizer


class Variable:
    """What both kinds share: the layout, this process's copy of the values and the weight decay's mask."""

    def __init__(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        slot_names: Sequence[str],
        dtype: Any = np.float32,
        value: np.ndarray | None = None,
    ) -> None:
        self.shapes = {k: tuple(int(n) for n in s) for k, s in shapes.items()}
        self.slot_names = tuple(slot_names)
        self.dtype = np.dtype(dtype)
        self.size = sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes.values())
        if value is not None and (value.shape != (self.size,) or value.dtype != self.dtype):
            raise ValueError(f"value must be a flat {self.dtype} buffer of {self.size} numbers")
        self.value = np.zeros(self.size, self.dtype) if value is None else value
        self.views = views_of(self.value, self.shapes)
        mask = np.zeros(self.size, self.dtype)
        for part in views_of(mask, self.shapes).values():
            if part.ndim > 1:  # weight decay is for matrices, never biases
                part[...] = 1
        self._mask = mask
        self._decay: tuple[float, np.ndarray] | None = None

    def _decay_for(self, updater: Optimizer, first: int, end: int) -> np.ndarray | None:
        if not updater.weight_decay:
            return None
        if self._decay is None or self._decay[0] != updater.weight_decay:
            self._decay = (updater.weight_decay, updater.weight_decay * self._mask)
        return self._decay[1][first:end]

    def _flat(self, values: Mapping[str, np.ndarray], what: str) -> np.ndarray:
        """Named arrays as one flat buffer of this variable's layout, or one sentence on what is missing."""
        out = np.empty(self.size, self.dtype)
        for name, view in views_of(out, self.shapes).items():
            if name not in values:
                raise ValueError(f"{what} has no {name!r}")
            given = np.asarray(values[name])
            if given.shape != view.shape:
                raise ValueError(f"{what}'s {name!r} has shape {given.shape}, the variable's is {view.shape}")
            view[...] = given
        return out

    def _named(self, flat: np.ndarray, suffix: str = "") -> dict[str, np.ndarray]:
        return {name + suffix: v for name, v in views_of(flat, self.shapes).items()}

    def _held(self, slots: bool) -> tuple[np.ndarray, Mapping[str, np.ndarray]]:
        """The values, and each slot if ``slots``, as held now, flat arrays of their own (the kind's to say where)."""
        raise NotImplementedError

    def save(self, slots: bool = True) -> dict[str, np.ndarray]:
        """The values by name, and with ``slots`` each slot as ``name/slot`` (a checkpoint keeps them)."""
        value, held = self._held(slots)
        out = self._named(value)
        for s, flat in held.items():
            out.update(self._named(flat, f"/{s}"))
        return out


class LocalVariable(Variable):
    """A variable in this process's memory: its updates are made here."""

    def __init__(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        slot_names: Sequence[str],
        dtype: Any = np.float32,
        value: np.ndarray | None = None,
    ) -> None:
        super().__init__(shapes, slot_names, dtype, value)
        self.slots = {s: np.zeros(self.size, self.dtype) for s in self.slot_names}
        self._grad = np.zeros(self.size, self.dtype)
        self._pushed = False
        self._tmp = np.empty(self.size, self.dtype)

    def init(self, values: Mapping[str, np.ndarray]) -> None:
        self.value[...] = self._flat(values, "the initial value")
        for slot in self.slots.values():
            slot[...] = 0

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The values of ``arrays`` (what :meth:`save` gave), and its slots if it holds them (else zeros)."""
        self.value[...] = self._flat(arrays, "the saved variable")
        for s, slot in self.slots.items():
            has = all(f"{name}/{s}" in arrays for name in self.shapes)
            slot[...] = self._flat(self._unsuffixed(arrays, s), "the saved slots") if has else 0

    def _unsuffixed(self, arrays: Mapping[str, np.ndarray], slot: str) -> dict[str, np.ndarray]:
        return {name: arrays[f"{name}/{slot}"] for name in self.shapes}

    def pull(self) -> np.ndarray:
        return self.value

    def push(self, grad: np.ndarray) -> None:
        if self._pushed:
            self._grad += grad
        else:
            self._grad[...] = grad
            self._pushed = True

    def update(self, updater: Optimizer) -> None:
        if not self._pushed:
            self._grad[...] = 0
        updater.apply(self.value, self._grad, self.slots, self._decay_for(updater, 0, self.size), self._tmp)
        self._pushed = False

    def _held(self, slots: bool) -> tuple[np.ndarray, Mapping[str, np.ndarray]]:
        return self.value.copy(), {s: buf.copy() for s, buf in self.slots.items()} if slots else {}

    def release(self) -> None:
        self.slots, self._grad = {}, np.zeros(0, self.dtype)


class PSVariable(Variable):
    """A variable in the parameter server's tables, split over the ranks; every rank makes it alike.

    ``ps`` is ``jobman.ps`` (``channel.parameter_server()``). Creating, initialising, loading, updating and
    releasing are collective: every rank calls them in the same order.
    """

    def __init__(
        self,
        ps: Any,
        shapes: Mapping[str, tuple[int, ...]],
        slot_names: Sequence[str],
        dtype: Any = np.float32,
        value: np.ndarray | None = None,
    ) -> None:
        super().__init__(shapes, slot_names, dtype, value)
        self._ps = ps
        self._table = ps.ArrayTableHandler(self.size, dtype=self.dtype)
        # placed as the values: each rank steps the same rows of values, slots and gradients
        self._slots = {s: ps.ArrayTableHandler(self.size, dtype=self.dtype, like=self._table) for s in self.slot_names}
        self._grads = [
            ps.ArrayTableHandler(self.size, dtype=self.dtype, like=self._table) for _ in range(ps.num_workers())
        ]
        self._rank = ps.worker_id()
        self._pushed = False
        first, end = self._table.local_rows
        self._sum = np.empty(end - first, self.dtype)
        self._tmp = np.empty(end - first, self.dtype)

    def _write(self, value: np.ndarray, slots: Mapping[str, np.ndarray | None]) -> None:
        """Every rank writes its own part of the values and slots (None: zeros), between two barriers: no rank
        still reads the old values, and every rank reads the new."""
        first, end = self._table.local_rows
        self._ps.barrier()
        with ExitStack() as stack:
            stack.enter_context(self._table.local())[:, 0] = value[first:end]
            for s, table in self._slots.items():
                given = slots.get(s)
                stack.enter_context(table.local())[:, 0] = 0 if given is None else given[first:end]
        self._ps.barrier()
        self.value[...] = value

    def init(self, values: Mapping[str, np.ndarray]) -> None:
        self._write(self._flat(values, "the initial value"), {})

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        """The values of ``arrays`` (what :meth:`save` gave), and its slots if it holds them (else zeros)."""
        slots: dict[str, np.ndarray | None] = {}
        for s in self.slot_names:
            has = all(f"{name}/{s}" in arrays for name in self.shapes)
            slots[s] = self._flat({n: arrays[f"{n}/{s}"] for n in self.shapes}, "the saved slots") if has else None
        self._write(self._flat(arrays, "the saved variable"), slots)

    def pull(self) -> np.ndarray:
        """The values as the last update left them, into ``value``."""
        self.value[...] = self._table.get()
        return self.value

    def push(self, grad: np.ndarray) -> None:
        """Add ``grad`` (flat) to this rank's gradient table: on its way, completed by the update's barrier."""
        self._grads[self._rank].add(grad)
        self._pushed = True

    def update(self, updater: Optimizer) -> None:
        """Collective: each rank sums its part of every rank's gradients in rank order, zeroes them, and steps
        its part of the values and slots; after it, every pull sees the new values."""
        self._ps.barrier()  # every push is in
        first, end = self._table.local_rows
        with ExitStack() as stack:
            grads = [stack.enter_context(table.local())[:, 0] for table in self._grads]
            self._sum[...] = grads[0]
            for g in grads[1:]:
                self._sum += g
            for g in grads:
                g[...] = 0
            p = stack.enter_context(self._table.local())[:, 0]
            slots = {s: stack.enter_context(t.local())[:, 0] for s, t in self._slots.items()}
            updater.apply(p, self._sum, slots, self._decay_for(updater, first, end), self._tmp)
        self._pushed = False
        self._ps.barrier()  # every part is stepped before anyone pulls

    def _held(self, slots: bool) -> tuple[np.ndarray, Mapping[str, np.ndarray]]:
        """As the tables hold them now: one-sided, any rank may call it alone."""
        return self._table.get(), {s: table.get() for s, table in self._slots.items()} if slots else {}

    def release(self) -> None:
        """Leave the parameter server (collective): its tables are freed with every other of this job's."""
        self._ps.shutdown()


class Tally:
    """Sums of a few numbers over the ranks of a gang, the same on every rank (added in rank order).

    ``reduce(values)`` is collective. Each rank writes its row of one half of a small table (zeroed by
    subtracting what it wrote there before, which is exact) and reads the other ranks' after a barrier; the
    halves alternate, so a fast rank never overwrites a row another has yet to read.
    """

    def __init__(self, ps: Any, width: int) -> None:
        self._ps = ps
        self._n, self._rank = ps.num_workers(), ps.worker_id()
        self._table = ps.MatrixTableHandler(2 * self._n, width, dtype=np.float64)
        self._last = np.zeros((2, width))
        self._calls = 0

    def put(self, values: Sequence[float]) -> None:
        """This rank's values for the next :meth:`sums`; a barrier must come between the two."""
        half = self._calls % 2
        row = [half * self._n + self._rank]
        self._table.add(-self._last[half][None], row_ids=row)
        self._last[half] = values
        self._table.add(self._last[half][None], row_ids=row)

    def sums(self) -> np.ndarray:
        """Every rank's values of the last :meth:`put`, added in rank order."""
        half = self._calls % 2
        self._calls += 1
        rows = self._table.get(row_ids=list(range(half * self._n, (half + 1) * self._n)))
        total = rows[0].copy()
        for row in rows[1:]:
            total += row
        return total

    def reduce(self, values: Sequence[float]) -> np.ndarray:
        self.put(values)
        self._ps.barrier()
        return self.sums()
