"""jobman.ps with real MPI processes started by the mpich wheel's mpiexec: sums across ranks, row ids, the
barrier completing adds, init values, tables larger than a shard, and the sentences bad input gets."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need_service

PROGRAM = Path(__file__).parent / "ps_programs" / "tables.py"
RUN_SECONDS = 300  # 2 shared cores and busy-polling ranks: generous, and the whole group is killed past it


def mpiexec() -> str:
    """The mpiexec beside this Python (the mpich wheel's), or any on PATH; missing: fail under CI, else skip."""
    if importlib.util.find_spec("mpi4py") is None:
        need_service("mpi4py is not installed (pip install -e '.[ps]')")
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        need_service("no mpiexec beside this Python or on PATH (pip install -e '.[ps]')")
    return found


def run(argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``argv`` in its own process group, killed whole if it outlives RUN_SECONDS."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} ran past {RUN_SECONDS} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture(scope="module", params=[2, pytest.param(3, marks=pytest.mark.slow)], ids=lambda n: f"{n}ranks")
def ranks(request, tmp_path_factory) -> list[dict]:
    """What each rank of one run of ps_programs/tables.py saw, by rank."""
    n, out = request.param, tmp_path_factory.mktemp(f"ps{request.param}")
    done = run([mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", str(PROGRAM), str(out)])
    assert done.returncode == 0, done.stderr
    seen = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(n)]
    assert [s["rank"] for s in seen] == list(range(n)) and all(s["size"] == n for s in seen), done.stdout
    return seen


def test_every_rank_reads_the_sum_of_every_ranks_adds(ranks: list[dict]) -> None:
    factor = sum(range(1, len(ranks) + 1))
    for seen in ranks:
        assert seen["array_sum"] == [i * factor for i in range(10)]
        assert seen["array_dtype"] == "float32"
        assert seen["master"] == (seen["rank"] == 0)


def test_init_values_are_the_tables_values_before_any_add(ranks: list[dict]) -> None:
    for seen in ranks:
        assert seen["init_array"] == list(range(7))
        assert seen["init_matrix"] == [[2.5] * 3] * 2
        assert seen["again"] == [1.0, 2.0]


def test_matrix_adds_and_gets_by_row_ids(ranks: list[dict]) -> None:
    n = len(ranks)
    expected = [[float(r + 1)] * 3 if r < n else [0.0] * 3 for r in range(4)] + [[2.0 * sum(range(1, n + 1))] * 3]
    for seen in ranks:
        assert seen["matrix"] == expected
        assert seen["matrix_rows"] == [expected[4], expected[0], expected[4]]


def test_the_barrier_completes_every_add_and_adds_are_atomic(ranks: list[dict]) -> None:
    for seen in ranks:
        assert seen["own_adds_before_barrier"]
        assert seen["counter"] == [200 * len(ranks)] * 4


def test_a_table_is_spread_over_the_ranks(ranks: list[dict]) -> None:
    shards = [seen["big_local_rows"] for seen in ranks]
    assert shards[0][0] == 0 and shards[-1][1] == 100_003
    assert all(a[1] == b[0] for a, b in zip(shards, shards[1:]))
    assert max(end - first for first, end in shards) <= 100_003 // len(ranks) + 1
    for seen in ranks:
        assert seen["big"] == [len(ranks), len(ranks)]  # the caller's delta changed after add: no effect


def test_a_small_table_is_held_whole_by_one_rank_the_tables_taking_turns(ranks: list[dict]) -> None:
    holders = []
    for table in range(2):
        shards = [seen["small_local_rows"][table] for seen in ranks]
        held = [rank for rank, (first, end) in enumerate(shards) if end > first]
        assert len(held) == 1 and shards[held[0]] == [0, 4], shards
        holders.append(held[0])
    assert holders[0] != holders[1]
    for seen in ranks:
        assert seen["small_sums"] == [[[float(len(ranks))] * 2] * 4] * 2


def test_a_small_tables_add_takes_any_delta_of_its_size_and_is_done_with_it_on_return(ranks: list[dict]) -> None:
    for seen in ranks:
        assert seen["small_deltas"] == [4.0 * len(ranks)] * 10
        assert seen["small_wrong_shape"] == "ArrayTableHandler's delta has shape (9,); this table expects 10 values."


def test_bad_input_gets_one_sentence(ranks: list[dict]) -> None:
    seen = ranks[-1]
    assert seen["before_init"] == "jobman.ps is not initialised: call jobman.ps.init() in every process first."
    assert seen["wrong_shape"] == "ArrayTableHandler's delta has shape (9,); this table expects 10 values."
    assert seen["wrong_rows_shape"] == "MatrixTableHandler's delta has shape (2, 3); this table expects shape (1, 3)."
    assert seen["row_out_of_range"] == "MatrixTableHandler has rows 0 to 4: row id 5 is out of range."
    assert seen["row_negative"] == "MatrixTableHandler has rows 0 to 4: row id -1 is out of range."
    assert seen["row_not_ints"].startswith("MatrixTableHandler's row_ids must be a list of whole numbers")
    assert seen["bad_size"] == "ArrayTableHandler's size must be a positive whole number, not 0."
    assert seen["bad_dtype"] == "ArrayTableHandler holds numbers that add up: bool is not an integer or float type."
    assert seen["bad_init"] == "MatrixTableHandler's init_value has shape (3,); this table expects shape (2, 2)."
    assert seen["after_shutdown_get"].startswith("This ArrayTableHandler was freed by jobman.ps.shutdown()")
    assert seen["after_shutdown_barrier"] == "jobman.ps was shut down: call jobman.ps.init() again before using it."


def test_a_job_of_one_process_is_refused_in_one_sentence() -> None:
    mpiexec()
    done = run(
        [
            sys.executable,
            "-c",
            "from jobman import ps, errors\ntry:\n    ps.init()\nexcept errors.UsageError as exc:\n    print(exc)",
        ]
    )
    assert done.stdout.strip() == (
        "jobman.ps needs a job of two or more processes (started by mpiexec -n N or srun); this one runs alone."
    ), done.stderr


def test_without_the_extra_the_first_call_says_what_to_install() -> None:
    done = run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['mpi4py'] = None\n"
            "from jobman import ps, errors\n"
            "try:\n    ps.init()\nexcept errors.UsageError as exc:\n    print(exc)",
        ]
    )
    assert done.stdout.startswith("jobman.ps needs MPI: install it with pip install 'jobman-sql[ps]'"), done.stderr


def test_importing_jobman_ps_does_not_start_mpi() -> None:
    done = run([sys.executable, "-c", "import sys, jobman.ps; print('mpi4py' in sys.modules)"])
    assert done.stdout.strip() == "False", done.stderr
