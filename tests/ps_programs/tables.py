"""Run under mpiexec by tests/test_ps.py: every rank exercises jobman.ps and writes what it saw as JSON to
OUT/rank-N.json (files, not stdout, where mpiexec may interleave the ranks' long lines)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from jobman import ps


def refusal(call) -> str:
    """The sentence ``call`` is refused with (or a note that it was not)."""
    try:
        call()
    except ps.PSError as exc:
        return str(exc)
    return "not refused"


def main() -> None:
    seen: dict = {"before_init": refusal(lambda: ps.ArrayTableHandler(3))}
    ps.init()
    rank, size = ps.worker_id(), ps.num_workers()
    seen.update(rank=rank, size=size, master=ps.is_master_worker())

    array = ps.ArrayTableHandler(10)
    array.add(np.arange(10) * (rank + 1))
    ps.barrier()
    seen["array_sum"] = array.get().tolist()
    seen["array_dtype"] = str(array.get().dtype)

    seen["init_array"] = ps.ArrayTableHandler(7, init_value=np.arange(7)).get().tolist()
    seen["init_matrix"] = ps.MatrixTableHandler(2, 3, init_value=2.5).get().tolist()

    matrix = ps.MatrixTableHandler(5, 3)
    matrix.add(np.full((3, 3), rank + 1), row_ids=[4, rank, 4])  # row 4 twice: the repeats add up
    ps.barrier()
    seen["matrix"] = matrix.get().tolist()
    seen["matrix_rows"] = matrix.get(row_ids=[4, 0, 4]).tolist()

    # Many adds, no barrier between them: a rank sees its own at once, everyone's after the barrier.
    counter = ps.ArrayTableHandler(4, dtype=np.int64)
    for _ in range(200):
        counter.add(np.ones(4, dtype=np.int64))
    seen["own_adds_before_barrier"] = int(counter.get()[0]) >= 200
    ps.barrier()
    seen["counter"] = counter.get().tolist()

    big = ps.ArrayTableHandler(100_003, dtype=np.float64)
    reused = np.full(100_003, 1.0)
    big.add(reused)
    reused[:] = 1000.0  # the add copied its delta: changing it now changes nothing
    ps.barrier()
    got = big.get()
    seen["big"] = [float(got.min()), float(got.max())]
    seen["big_local_rows"] = list(big.local_rows)

    small = ps.ArrayTableHandler(10)  # held whole by one rank: an add hands MPI the caller's array when it can
    given = np.ones(10, dtype=np.float32)
    small.add(given)
    given[:] = 1000.0  # the add is done with it when it returns: changing it now changes nothing
    small.add(np.ones(20, dtype=np.float32)[::2])  # not contiguous: copied first
    small.add(np.ones((10, 1), dtype=np.float32))  # a column of the 10 values
    small.add([1] * 10)
    ps.barrier()
    seen["small_deltas"] = small.get().tolist()
    seen["small_wrong_shape"] = refusal(lambda: small.add(np.ones(9, dtype=np.float32)))

    pair = [ps.MatrixTableHandler(4, 2) for _ in range(2)]  # small: each held whole by one rank, in turns
    for table in pair:
        table.add(np.ones((4, 2)))
    ps.barrier()
    seen["small_local_rows"] = [list(table.local_rows) for table in pair]
    seen["small_sums"] = [table.get().tolist() for table in pair]

    seen["wrong_shape"] = refusal(lambda: array.add(np.ones(9)))
    seen["wrong_rows_shape"] = refusal(lambda: matrix.add(np.ones((2, 3)), row_ids=[0]))
    seen["row_out_of_range"] = refusal(lambda: matrix.get(row_ids=[0, 5]))
    seen["row_negative"] = refusal(lambda: matrix.add(np.ones((1, 3)), row_ids=[-1]))
    seen["row_not_ints"] = refusal(lambda: matrix.get(row_ids=[0.5]))
    seen["bad_size"] = refusal(lambda: ps.ArrayTableHandler(0))
    seen["bad_dtype"] = refusal(lambda: ps.ArrayTableHandler(3, dtype=bool))
    seen["bad_init"] = refusal(lambda: ps.MatrixTableHandler(2, 2, init_value=np.ones(3)))

    ps.shutdown()
    seen["after_shutdown_get"] = refusal(array.get)
    seen["after_shutdown_barrier"] = refusal(ps.barrier)
    ps.init()  # a second life: tables made again work again
    again = ps.ArrayTableHandler(2, init_value=[1, 2])
    seen["again"] = again.get().tolist()
    ps.shutdown()
    (Path(sys.argv[1]) / f"rank-{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    sys.exit(main())
