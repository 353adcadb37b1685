"""How a job ended, decided without running anything: the call's ending from what the function
returned, and the worker's verdict from exit status, signal, report and why it stopped the job."""

from __future__ import annotations

import os
import signal

import pytest

from jobman.dispatch.channel import COMPLETE, INCOMPLETE, DirectChannel
from jobman.dispatch.experiment import CallEnd, ending_of, failure_why
from jobman.dispatch.runner import EXIT_INCOMPLETE, classify_end, run_here


def exited(code: int) -> int:
    """An ``os.waitpid`` status for a process that exited with ``code``."""
    return code << 8


def killed(sig: int) -> int:
    """An ``os.waitpid`` status for a process killed by ``sig``."""
    return int(sig)


def test_the_status_helpers_speak_waitpid():
    assert os.WIFEXITED(exited(3)) and os.WEXITSTATUS(exited(3)) == 3
    assert os.WIFSIGNALED(killed(signal.SIGKILL)) and os.WTERMSIG(killed(signal.SIGKILL)) == signal.SIGKILL


@pytest.mark.parametrize(
    "ret, status", [(None, "DONE"), (COMPLETE, "DONE"), (INCOMPLETE, "INCOMPLETE"), (42, "FAILED")]
)
def test_a_return_value_ends_the_call(ret, status):
    end = ending_of(ret, {"x": 1})
    assert end.status == status and end.results == {"x": 1}
    assert (end.error is None) == (status != "FAILED")
    if status == "FAILED":
        assert "returned 42" in end.error and end.why == end.error


def test_a_pruned_call_is_done_whatever_it_returned():
    for ret in (None, COMPLETE, INCOMPLETE):
        end = ending_of(ret, {"loss": 1.0}, pruned=True, stop_reason="worse than the median")
        assert end == CallEnd("DONE", {"loss": 1.0, "pruned": True, "pruned_why": "worse than the median"})


def test_the_event_log_gets_the_last_line_of_a_failure():
    assert failure_why("Traceback...\n  line\nValueError: bad\n") == "ValueError: bad"
    assert failure_why(None) == failure_why("") == failure_why("  \n ") == "failed"
    assert len(failure_why("x" * 1000)) == 300
    assert CallEnd("DONE", {}, None).why is None


def report(status: str, results: dict | None = None, error: str | None = None) -> dict:
    return {"op": "report", "status": status, "results": results or {}, "error": error}


def test_a_function_ends_as_it_reported():
    end = classify_end("fn", exited(0), report("DONE", {"loss": 0.1}))
    assert (end.outcome, end.results, end.error, end.exit_code, end.why) == ("DONE", {"loss": 0.1}, None, None, None)
    end = classify_end("fn", exited(0), report("FAILED", {}, "Traceback\nKeyError: 'x'"))
    assert end.outcome == "FAILED" and end.why == "KeyError: 'x'" and end.exit_code is None


def test_a_function_that_exits_without_a_report_failed():
    end = classify_end("fn", exited(3))
    assert end.outcome == "FAILED" and end.exit_code == 3 and end.error == "the job's process exited with code 3"
    end = classify_end("fn", exited(0))
    assert end.outcome == "FAILED" and end.error.endswith("without reporting an outcome")


def test_a_killed_process_crashed_and_the_oom_killer_is_named_only_when_nobody_here_killed_it():
    end = classify_end("fn", killed(signal.SIGSEGV))
    assert end.outcome == "CRASHED" and end.error == "the job's process was killed by SIGSEGV" and end.why == end.error
    end = classify_end("fn", killed(signal.SIGKILL), oom_cause="out of memory: 2 GB")
    assert end.error == "the job's process was killed by SIGKILL (out of memory: 2 GB)"
    end = classify_end("fn", killed(signal.SIGKILL), stopped_for="cancel", oom_cause="out of memory: 2 GB")
    assert end.outcome == "CRASHED" and "out of memory" not in end.error and end.why == "cancelled while running"


def test_a_fork_server_that_died_crashed_the_job():
    end = classify_end("fn", killed(signal.SIGKILL), server_gone=True, oom_cause="ignored")
    assert end.outcome == "CRASHED" and "fork server died" in end.error


def test_a_command_ends_by_its_exit_code_and_results_file():
    assert classify_end("cmd", exited(0), command_results={"a": 1}).outcome == "DONE"
    end = classify_end("cmd", exited(EXIT_INCOMPLETE), command_results={"a": 1})
    assert (end.outcome, end.results, end.exit_code) == ("INCOMPLETE", {"a": 1}, EXIT_INCOMPLETE)
    end = classify_end("cmd", exited(0), command_error="$JOBMAN_RESULTS (r.json) is not valid JSON")
    assert end.outcome == "FAILED" and end.why.startswith("$JOBMAN_RESULTS")
    end = classify_end("cmd", exited(2), stderr_tail="\n--- end of stderr ---\nusage: train.py")
    assert end.outcome == "FAILED" and end.exit_code == 2 and end.why == "usage: train.py"


def test_the_time_limit_fails_whatever_did_not_finish():
    end = classify_end("fn", killed(signal.SIGKILL), stopped_for="timeout", timeout=2.5)
    assert end.outcome == "FAILED" and end.why == "time limit of 2.5 s exceeded"
    assert end.error == "the job's process was killed by SIGKILL\ntime limit of 2.5 s exceeded"
    done = classify_end("fn", exited(0), report("DONE"), stopped_for="timeout", timeout=2.5)
    assert done.outcome == "DONE" and done.why is None


def test_a_stopping_worker_puts_back_what_can_resume():
    assert classify_end("fn", exited(0), report("INCOMPLETE"), stopped_for="stopping").outcome == "REQUEUE"
    assert classify_end("fn", killed(signal.SIGKILL), stopped_for="stopping").outcome == "REQUEUE"
    assert classify_end("fn", exited(0), report("DONE"), stopped_for="stopping").outcome == "DONE"
    assert classify_end("fn", exited(0), report("FAILED", error="boom"), stopped_for="stopping").outcome == "FAILED"


def test_run_here_builds_the_state_and_leaves_recording_to_its_caller(tmp_path):
    seen = {}

    def job(state, channel):
        seen.update(lr=state.lr, resumed=state.get("epoch"), info=state.jobman.table)
        state.epoch = 3

    channel = DirectChannel(job_id=None, phase=0, attempt=1, workdir=tmp_path, params={"lr": 0.1})
    end = run_here(job, channel, {"epoch": 2}, {"table": "t"})
    assert end == CallEnd("DONE", {"epoch": 3})
    assert seen == {"lr": 0.1, "resumed": 2, "info": "t"}
    assert not (tmp_path / DirectChannel.STATE_FILE).exists()  # recording is the caller's


def test_run_here_lets_an_interrupt_through():
    def job(state, channel):
        raise KeyboardInterrupt

    channel = DirectChannel(job_id=None, phase=0, attempt=1, workdir=".", params={})
    with pytest.raises(KeyboardInterrupt):
        run_here(job, channel)
