"""A parameter server with Multiverso's API, over MPI one-sided operations (``jobman.ps``).

The processes of one job (``mpiexec -n N``, ``srun``) share tables of numbers: each adds deltas (its
gradients) and gets the current values, without a server process::

    from jobman import ps

    ps.init()
    weights = ps.ArrayTableHandler(1000, init_value=np.zeros(1000))
    weights.add(gradient)          # asynchronous: on its way to the ranks that own the values
    ps.barrier()                   # every add of every rank made before it is now visible
    current = weights.get()        # the whole table, the sum of every add
    ps.shutdown()

How it works, and why:

- A table is split into contiguous shards, one per rank (a matrix by rows, so a row never spans two
  ranks), each held in that rank's ``MPI.Win.Allocate`` window: a table larger than one process's
  memory works, and no rank serves the others. A small table (up to ``WHOLE_BYTES``) is held whole by
  one rank, the tables taking turns: its add and its get are then one operation each, not one per rank.
- ``add`` is ``Accumulate(op=SUM)`` into the owning ranks' windows under a shared ``Lock_all`` held for
  the table's life. It returns at once, and the caller may reuse its array: a split table's delta is
  copied first; a small table's is handed to ``Raccumulate`` as it is (when it has the table's dtype and
  shape, else through a copy kept for it), whose request is done, the array free, before ``add`` returns.
  Adds are completed at their targets by the next ``barrier()`` (a ``Flush`` of each window added to
  since the last one, then ``Barrier``), or earlier when the copies waiting for completion pass
  ``PENDING_BYTES``. Only a flush completes an add at its target in MPI, even a request-based one.
- ``get`` is ``Rget_accumulate(op=NO_OP)``, not ``Get``: MPI makes accumulate operations atomic per
  element against each other, but a ``Get`` concurrent with another rank's ``Accumulate`` to the same
  place is undefined, and an exclusive lock to make it safe would serialise every rank. A request-based
  get's values are in place when its request is done: waiting on it costs a fraction of a ``Flush``. MPI
  orders accumulates from one origin to one target, so a rank always sees its own earlier adds.
- Passive-target progress: on one node MPICH maps ``Win.Allocate`` windows into shared memory and the
  calling rank does the work itself, so adds and gets land while their target computes without entering MPI
  (measured in ``bench/RESULTS-ps.md``); no helper thread is started. Across nodes a target must enter MPI
  unless MPICH's progress thread is on (``MPIR_CVAR_ASYNC_PROGRESS=1``), which costs a polling thread per
  rank: on a shared node of 2 cores it made adds and gets 4 to 37 times slower, so it is the user's choice.
- Small tables pay for synchronisation: a step of a 1,000-float table (add, barrier, get) makes three
  trips where one ``Allreduce`` makes one, with Python around each (measured in ``bench/RESULTS-ps.md``,
  with the table split over the ranks and held whole); from a million floats it takes about as long. So
  a small table's add and get take the fewest calls: one request each, the barrier flushing only the
  windows added to. A split table's add copies its delta into the copy a completed add left, and a small
  table's get lands in one buffer before it is copied out: MPI (through UCX) registers the memory it is
  given, and fresh memory on each call cost more than the operation itself. ``MPIR_CVAR_POLLS_BEFORE_YIELD=0``
  (spin, never yield) helped small steps under load and hurt them on a quieter machine: left to the user.
- ``init_value`` is written by the rank that owns each part, at creation, which is collective as in
  Multiverso: every rank creates the same tables in the same order, with the same arguments.
- A job of one process is refused: there would be nothing to share. MPI itself is imported on the
  first call (``pip install 'jobman-sql[ps]'``), so jobs that do not use it never pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobman.jobdb.errors import UsageError

# Copies of deltas waiting for completion past this size are completed at once, to bound memory.
PENDING_BYTES = 256 << 20
# A table of at most this many bytes is held whole by one rank (the tables taking turns): an add or a get
# is then one trip, where a table split over N ranks costs N; past it, spreading the memory wins.
WHOLE_BYTES = 64 << 10
# MPI (through UCX) registers the memory it works on and remembers it: an add into the copy kept from the
# previous one is several times faster than into fresh memory. Kept for tables up to this size.
SPARE_BYTES = 64 << 20


class PSError(UsageError):
    """jobman.ps was used in a way it cannot be."""


@dataclass
class _World:
    """What ``init`` set up: MPI, this job's communicator and the live tables."""

    MPI: Any
    comm: Any
    tables: list[_Table] = field(default_factory=list)
    unflushed: list[_Table] = field(default_factory=list)  # the tables added to since the last barrier


_world: _World | None = None
_was_shut_down = False


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as exc:  # mpi4py missing, or present without an MPI library
        raise PSError(
            "jobman.ps needs MPI: install it with pip install 'jobman-sql[ps]' "
            f"(mpi4py and mpich; the import said: {exc})."
        ) from None
    return MPI


def _need_world() -> _World:
    if _world is not None:
        return _world
    if _was_shut_down:
        raise PSError("jobman.ps was shut down: call jobman.ps.init() again before using it.")
    raise PSError("jobman.ps is not initialised: call jobman.ps.init() in every process first.")


def init(comm: Any = None) -> None:
    """Join the job's processes (all of MPI's world, or ``comm``); collective, and a no-op when done."""
    global _world, _was_shut_down
    if _world is not None:
        return
    MPI = _import_mpi()
    parent = MPI.COMM_WORLD if comm is None else comm
    if parent.Get_size() < 2 and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise PSError(
            "jobman.ps needs the ranks of the job to be one MPI world, which forked ranks are not: "
            "start the gang through mpiexec (JOBMAN_GANG_LAUNCH=mpiexec for the worker or dispatch)."
        )
    if parent.Get_size() < 2:
        raise PSError(
            "jobman.ps needs a job of two or more processes (started by mpiexec -n N or srun); this one runs alone."
        )
    _world = _World(MPI, parent.Dup())  # our own communicator: the job's own messages never meet ours
    _was_shut_down = False


def barrier() -> None:
    """Complete every add this process made, then wait for all: after it every get sees every earlier add."""
    world = _need_world()
    if world.unflushed:
        for table in world.unflushed:
            table._complete()
            table._unflushed = False
        world.unflushed.clear()
    world.comm.Barrier()


def shutdown() -> None:
    """Complete every add, free every table (collective), and leave; MPI itself ends with the process."""
    global _world, _was_shut_down
    world = _need_world()
    barrier()
    for table in world.tables:
        table._free()
    world.comm.Free()
    _world, _was_shut_down = None, True


def num_workers() -> int:
    """How many processes share the tables."""
    return _need_world().comm.Get_size()


def worker_id() -> int:
    """This process's rank, from 0 to ``num_workers() - 1``."""
    return _need_world().comm.Get_rank()


def is_master_worker() -> bool:
    """Whether this process is rank 0, the one whose results are the job's."""
    return worker_id() == 0


def _split(rows: int, ranks: int, holder: int | None = None) -> np.ndarray:
    """The first row of each rank's shard, and the end: as even as can be, the larger shards first; or, with
    ``holder``, every row on that rank and none on the others."""
    sizes = np.full(ranks, rows // ranks, dtype=np.int64)
    sizes[: rows % ranks] += 1
    if holder is not None:
        sizes[:] = 0
        sizes[holder] = rows
    return np.concatenate([[0], np.cumsum(sizes)])


class _Table:
    """A ``rows x cols`` table of ``dtype`` split by rows over the ranks: the core of both handlers."""

    def __init__(
        self,
        rows: int,
        cols: int,
        init_value: Any,
        dtype: Any,
        name: str,
        labels: tuple[str, ...],
        like: _Table | None = None,
    ) -> None:
        world = _need_world()
        self._name = name
        for label, n in zip(labels, (rows, cols)):
            if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
                raise PSError(f"{name}'s {label} must be a positive whole number, not {n!r}.")
        self.dtype = np.dtype(dtype)
        if self.dtype.kind not in "iuf":
            raise PSError(f"{name} holds numbers that add up: {self.dtype} is not an integer or float type.")
        self.rows, self.cols = int(rows), int(cols)
        self._world = world
        from mpi4py.util.dtlib import from_numpy_dtype

        self._mpi_type = from_numpy_dtype(self.dtype)
        self._nothing = [np.empty(0, self.dtype), 0, self._mpi_type]  # a get's ignored origin
        ranks = world.comm.Get_size()
        self._holder: int | None
        self._bounds: np.ndarray
        if like is not None:  # rows placed as another table's: each rank's local() rows line up with its
            if like.rows != self.rows:
                raise PSError(
                    f"{name} placed like a table of {like.rows} rows must have {like.rows} rows, not {self.rows}."
                )
            self._holder, self._bounds = like._holder, like._bounds
        else:
            small = self.rows * self.cols * self.dtype.itemsize <= WHOLE_BYTES
            self._holder = len(world.tables) % ranks if small else None
            self._bounds = _split(self.rows, ranks, self._holder)
        first, end = self.local_rows
        initial = None if init_value is None else self._shaped(init_value, "init_value")
        self._win = world.MPI.Win.Allocate(
            (end - first) * self.cols * self.dtype.itemsize, self.dtype.itemsize, comm=world.comm
        )
        np.frombuffer(self._win, dtype=self.dtype)[:] = 0 if initial is None else initial[first:end].ravel()
        world.comm.Barrier()  # every shard holds its initial value before anyone adds to it
        self._win.Lock_all()
        self._whole = list(self._pieces(None))  # the pieces of a whole-table add or get, worked out once
        self._pending: list[np.ndarray] = []
        self._spare: list[np.ndarray] = []  # a completed add's copy, to take the next one
        self._pending_bytes = 0
        self._unflushed = False  # added to since the last barrier, which must then flush this window
        # A small table's add and get are one operation each, into and out of buffers kept here: the caller's
        # delta goes as it is when it already has the table's dtype and shape, as one copied into _scratch if not.
        self._span = self._whole[0][2][0]
        self._SUM, self._NO_OP = world.MPI.SUM, world.MPI.NO_OP
        self._shapes = {(self.rows, self.cols)} | ({(self.rows,)} if self.cols == 1 else set())
        self._scratch = np.empty((self.rows, self.cols), dtype=self.dtype) if self._holder is not None else None
        self._landing = None if self._holder is None else np.empty((self.rows, self.cols), dtype=self.dtype)
        world.tables.append(self)

    @property
    def local_rows(self) -> tuple[int, int]:
        """The rows this process holds: ``(first, end)``."""
        rank = self._world.comm.Get_rank()
        return int(self._bounds[rank]), int(self._bounds[rank + 1])

    @contextmanager
    def local(self) -> Iterator[np.ndarray]:
        """This process's own rows, as a writable array over its shard of the table, for work done where the
        values live (an updater's step). Use it between two ``barrier()`` calls, when no rank adds or gets:
        MPI orders the memory only at ``Win.Sync``, done on entering and leaving."""
        self._live()
        first, end = self.local_rows
        self._win.Sync()
        try:
            yield np.frombuffer(self._win, dtype=self.dtype).reshape(end - first, self.cols)
        finally:
            self._win.Sync()

    def _live(self) -> None:
        if self._win is None:
            raise PSError(f"This {self._name} was freed by jobman.ps.shutdown(); make it again after init().")

    def _shaped(self, data: Any, what: str, count: int | None = None, into: np.ndarray | None = None) -> np.ndarray:
        """``data`` as a fresh ``count x cols`` array of the table's dtype (copied ``into`` that one, if given),
        or one sentence on its shape."""
        count = self.rows if count is None else count
        if isinstance(data, np.ndarray) and data.dtype == self.dtype and data.size == count * self.cols:
            if data.shape == (count, self.cols) or self.cols == 1:  # the common case, checked cheaply
                if into is None:
                    return data.reshape(count, self.cols).copy()
                np.copyto(into, data.reshape(count, self.cols))
                return into
        try:
            array = np.array(data, dtype=self.dtype, copy=True)
        except (TypeError, ValueError) as exc:
            raise PSError(f"{self._name}'s {what} must be numbers: {exc}.") from None
        if array.ndim == 0 and what == "init_value":
            return np.full((count, self.cols), array, dtype=self.dtype)
        if array.size != count * self.cols or (self.cols > 1 and array.shape != (count, self.cols)):
            want = f"{count * self.cols} values" if self.cols == 1 else f"shape ({count}, {self.cols})"
            raise PSError(f"{self._name}'s {what} has shape {array.shape}; this table expects {want}.")
        if into is not None:
            np.copyto(into, array.reshape(count, self.cols))
            return into
        return np.ascontiguousarray(array.reshape(count, self.cols))

    def _rows(self, row_ids: Any) -> np.ndarray:
        """``row_ids`` checked, as sorted unique rows and where each id is among them."""
        ids = np.asarray(row_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise PSError(f"{self._name}'s row_ids must be a list of whole numbers, not {row_ids!r}.")
        ids = ids.astype(np.int64)
        bad = ids[(ids < 0) | (ids >= self.rows)]
        if bad.size:
            raise PSError(f"{self._name} has rows 0 to {self.rows - 1}: row id {int(bad[0])} is out of range.")
        return ids

    def _pieces(self, rows: np.ndarray | None) -> Iterator[tuple[int, slice, tuple[tuple[int, int, Any], Any]]]:
        """Per rank holding some of ``rows`` (sorted, unique; None for all): that rank, which of ``rows``
        (a slice) and the MPI target spec of their places in its window."""
        if rows is None:
            ranks = len(self._bounds) - 1
            for step in range(ranks):  # each rank starts with its own shard: they do not all queue at rank 0's
                owner = (self._world.comm.Get_rank() + step) % ranks
                first, end = int(self._bounds[owner]), int(self._bounds[owner + 1])
                if end > first:
                    yield owner, slice(first, end), ((0, (end - first) * self.cols, self._mpi_type), None)
            return
        owners = np.searchsorted(self._bounds, rows, side="right") - 1
        starts = np.flatnonzero(np.diff(owners, prepend=-1))
        for begin, end in zip(starts, [*starts[1:], rows.size]):
            owner = int(owners[begin])
            offsets = rows[begin:end] - self._bounds[owner]
            yield owner, slice(int(begin), int(end)), self._target(offsets)

    def _target(self, offsets: np.ndarray) -> tuple[tuple[int, int, Any], Any]:
        """Contiguous rows as a plain span, others as an indexed type (returned too, to be freed)."""
        if offsets[-1] - offsets[0] + 1 == offsets.size:
            return (int(offsets[0]) * self.cols, offsets.size * self.cols, self._mpi_type), None
        indexed = self._mpi_type.Create_indexed_block(self.cols, (offsets * self.cols).tolist()).Commit()
        return (0, 1, indexed), indexed

    def _added(self) -> None:
        """Note that this table was added to: the next barrier flushes its window."""
        if not self._unflushed:
            self._unflushed = True
            self._world.unflushed.append(self)

    def _add_whole(self, data: Any) -> None:
        """Add to every row: for a small table, one operation, its delta free again when it returns."""
        win = self._win
        if win is None or self._scratch is None:
            return self._add(data, None)
        self._added()
        if not (
            type(data) is np.ndarray
            and data.dtype == self.dtype
            and data.shape in self._shapes
            and data.flags.c_contiguous
        ):
            data = self._shaped(data, "delta", into=self._scratch)
        win.Raccumulate(data, self._holder, target=self._span, op=self._SUM).Wait()

    def _get_whole(self) -> np.ndarray:
        """Every row: for a small table, one operation into the memory kept for it, then copied out."""
        win = self._win
        if win is None or self._landing is None:
            return self._get(None)
        win.Rget_accumulate(self._nothing, self._landing, self._holder, target=self._span, op=self._NO_OP).Wait()
        return self._landing.copy()

    def _add(self, data: Any, row_ids: Any) -> None:
        self._live()
        self._added()
        rows = None
        if row_ids is None:  # into a copy kept from an earlier add: MPI works on memory it has seen faster
            delta = self._shaped(data, "delta", into=self._spare.pop() if self._spare else None)
        else:
            ids = self._rows(row_ids)
            given = self._shaped(data, "delta", ids.size)
            rows, where = np.unique(ids, return_inverse=True)
            if rows.size == ids.size and np.array_equal(rows, ids):
                delta = given
            else:  # repeated or unsorted ids: summed here, as MPI forbids overlapping targets in one call
                delta = np.zeros((rows.size, self.cols), dtype=self.dtype)
                np.add.at(delta, where.ravel(), given)
        SUM = self._world.MPI.SUM
        for owner, part, (target, datatype) in self._whole if rows is None else self._pieces(rows):
            self._win.Accumulate(delta[part], owner, target=target, op=SUM)
            if datatype is not None:
                datatype.Free()  # MPI keeps it until the operation using it completes
        self._pending.append(delta)  # MPI may read it until the add is completed
        self._pending_bytes += delta.nbytes
        if self._pending_bytes > PENDING_BYTES:
            self._complete()

    def _get(self, row_ids: Any) -> np.ndarray:
        self._live()
        rows = order = None
        if row_ids is not None:
            rows, order = np.unique(self._rows(row_ids), return_inverse=True)
        MPI = self._world.MPI
        if rows is None and self._landing is not None:
            return self._get_whole()
        out = np.empty((self.rows if rows is None else rows.size, self.cols), dtype=self.dtype)
        requests = []
        for owner, part, (target, datatype) in self._whole if rows is None else self._pieces(rows):
            requests.append(self._win.Rget_accumulate(self._nothing, out[part], owner, target=target, op=MPI.NO_OP))
            if datatype is not None:
                datatype.Free()  # MPI keeps it until the operation using it completes
        MPI.Request.Waitall(requests)  # a request-based get is complete, its values in place, when it is done
        return out if order is None else out[order.ravel()]

    def _complete(self) -> None:
        """Complete at their targets the adds made since the last barrier (only a flush does, in MPI)."""
        if self._win is None:
            return
        if self._holder is None:
            self._win.Flush_all()
        else:
            self._win.Flush(self._holder)
        if self._pending:
            whole = [delta for delta in self._pending if delta.shape == (self.rows, self.cols)]
            self._spare = whole[-1:] if self.rows * self.cols * self.dtype.itemsize <= SPARE_BYTES else []
            self._pending, self._pending_bytes = [], 0

    def _free(self) -> None:
        if self._win is not None:
            self._win.Unlock_all()
            self._win.Free()
            self._win = None


class ArrayTableHandler(_Table):
    """A vector of ``size`` numbers shared by every process (Multiverso's ArrayTable); float32 by default."""

    def __init__(self, size: int, init_value: Any = None, dtype: Any = np.float32, like: Any = None) -> None:
        """``like``: another table of as many rows whose placement this one shares, so that ``local()``
        gives the same rows of both on every rank (a variable's values, slots and gradients)."""
        super().__init__(size, 1, init_value, dtype, "ArrayTableHandler", ("size",), like)

    def add(self, delta: Any) -> None:
        """Add ``delta`` (``size`` numbers) to the table, asynchronously: ``barrier()`` completes it."""
        self._add_whole(delta)

    def get(self) -> np.ndarray:
        """The table's current values, as a new array of ``size`` numbers."""
        return self._get_whole().reshape(self.rows)


class MatrixTableHandler(_Table):
    """A ``num_row x num_col`` matrix shared by every process (Multiverso's MatrixTable), split by rows."""

    def __init__(
        self, num_row: int, num_col: int, init_value: Any = None, dtype: Any = np.float32, like: Any = None
    ) -> None:
        """``like``: as for :class:`ArrayTableHandler`."""
        super().__init__(num_row, num_col, init_value, dtype, "MatrixTableHandler", ("num_row", "num_col"), like)

    def add(self, data: Any, row_ids: Any = None) -> None:
        """Add ``data`` to the whole matrix, or to the rows ``row_ids`` (one row of data each; repeats add up)."""
        if row_ids is None:
            self._add_whole(data)
        else:
            self._add(data, row_ids)

    def get(self, row_ids: Any = None) -> np.ndarray:
        """The current matrix, or its rows ``row_ids`` in the order given, as a new 2-D array."""
        return self._get_whole() if row_ids is None else self._get(row_ids)
