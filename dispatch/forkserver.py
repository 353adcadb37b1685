"""The fork server: a small process that forks function jobs for a worker (its loop, and the job
processes' side). The worker's handle on it is ``dispatch.forkhandle``.

Forking the worker itself (SQLAlchemy, a database driver, rich: some 40 MB) costs
milliseconds per job in page-table copies, copy-on-write faults and the exit of
a large process. The fork server is a second interpreter that imports only the
experiment API and the jobs' own modules, each once: its children start warm and
cheap. A child never touches the database: ``channel.save()`` and
``channel.log()`` are requests to the worker over the job's socket, written by
the worker under the job's lease, and the job's outcome is its last message.

By default each job is a fresh fork. With ``jobs_per_process`` K > 1 a job process
runs up to K jobs in turn, then exits and the next job gets a fresh one (a task
queue's max-tasks-per-child): a job then sees what the jobs before it in the same
process left behind (imported modules and their globals, ``os.environ``, threads
it started), but a crash still takes down only the job that was running, and the
worker stays apart. Such a process talks to its worker directly, over one socket
for all its jobs: the worker sends a job; the process answers once any stop signal
meant for the job before has been discarded (a signal the worker sends after that
reaches the new job's handlers), runs it, ends every process the job left behind
(its cgroup's, its group's, and its orphans': it is a subreaper), then sends the
report. The server forks it, then only waits for its exit, which it reports to the
worker: a crash is seen as in a fresh process. A job then costs two messages and no fork.

Command jobs are its children too: it forks and executes them (argv and environment
come in the request), so that what they leave behind is orphaned to it, a subreaper,
and killed when they end. Each job process has a process group and, where the machine
allows, a cgroup of its own (``dispatch.cgroup``).

Lifetimes are chained: the server dies with its worker and a job with its server
(``PR_SET_PDEATHSIG``), so no job runs unwatched; told of its worker's death, the
server first kills its job's cgroup, process group and orphans. The server ignores SIGTERM, SIGINT
and SIGUSR1: stopping a job is its worker's decision (it signals the job itself),
and a signal sent to a whole process group must not kill the server under a job
that is checkpointing.

Messages on both sockets are ``dispatch.messages``'s; the lifetime chain is ``dispatch.lifetime``'s.
"""

from __future__ import annotations

import base64
import functools
import gc
import os
import select
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobman.jobdb.artifacts import open_store  # standard library only, imported once by the server

from .cgroup import Slot, cgroup_of, enter_own_cgroup, job_cgroup_base, kill_cgroup, worker_folder
from .channel import Parent, RankChannel, WorkerChannel, job_state, taking, to_jsonable
from .experiment import CallEnd, TargetError, call, given, load_function, resolve, resumed, takes_state_and_channel
from .gang import Gang, GangError, RankFailed, launch_of
from .leftovers import end_job_processes
from .lifetime import LAST_RITES, become_subreaper, die_with_parent, signal_on_parent_death
from .messages import recv_msg, send_msg
from .provenance import CodeRecords

STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}


def job_main(fn: Callable[..., Any], request: dict[str, Any], sock: socket.socket, mask: set) -> dict[str, Any]:
    """Inside the job's process: run the function; its outcome, the report to send to the worker."""
    workdir = Path(request["workdir"])
    os.environ.update(request.get("env", {}))
    os.chdir(workdir)
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    job = request["job"]
    store = _artifact_store(request.get("artifacts"))
    try:
        saved = resumed(job["results"], store)
        taken = given(request.get("taken"), store)
    except ValueError as exc:  # an artifact of its checkpoint, or of a call it takes, gone from the store
        return {"op": "report", "status": "FAILED", "results": job["results"] or {}, "error": str(exc)}
    state = job_state(job["params"], saved, job.get("jobman"))
    parents = parents_of(request)
    world_size = request.get("ranks", 1)
    channel = WorkerChannel(
        job["id"],
        job["phase"],
        job["attempt"],
        workdir,
        dict(job["params"]),
        parents,
        deadline=request["deadline"],
        save_every=request.get("save_every"),
        rank=request.get("rank", 0),
        world_size=world_size,
        artifacts=store,
        sock=sock,
    )
    taking(channel, state, taken)
    gang = None
    if world_size > 1 and "rank" not in request:  # the job's process leads its gang: the ranks start first
        try:
            gang = Gang(world_size, functools.partial(_report_for_gang, channel, sock), launch_of(world_size))
            gang.start(functools.partial(run_other_rank, fn, request, parents, mask), request)
        except (GangError, OSError) as exc:
            if gang is not None:
                gang.kill_all()
            return {"op": "report", "status": "FAILED", "results": None, "error": f"the gang could not start: {exc}"}
    channel.install_signal_handlers()
    if gang is not None:
        gang.pass_on_stops()
    signal.signal(LAST_RITES, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if gang is not None and gang.relays:  # rank 0 is a process of mpiexec or srun: its words are relayed
        report = gang.relay_rank_0(sock, channel.asking)
        status, error = gang.finish(report["status"], report["error"])
        return {**report, "status": status, "error": error}
    try:
        outcome = call(fn, state, channel)
    except BaseException:  # noqa: BLE001 - SystemExit and friends from the job
        outcome = CallEnd("FAILED", {}, traceback.format_exc(limit=20))
    status, error = outcome.status, outcome.error
    if gang is not None:
        status, error = gang.finish(status, error)
    sys.stdout.flush()
    sys.stderr.flush()
    return {"op": "report", "status": status, "results": to_jsonable(outcome.results), "error": error}


def parents_of(request: dict[str, Any]) -> list[Parent]:
    """What a job knows of the jobs it depends on, from its request."""
    return [
        Parent(p["id"], p["phase"], p["target"], Path(p["workdir"]), p["params"], p["results"])
        for p in request["parents"]
    ]


def run_other_rank(
    fn: Callable[..., Any], request: dict[str, Any], parents: list[Parent], mask: set, rank: int
) -> None:
    """Rank ``rank`` > 0 of a gang job: the same call, with a channel whose writes are ignored."""
    job = request["job"]
    channel = RankChannel(
        job["id"],
        job["phase"],
        job["attempt"],
        Path(request["workdir"]),
        dict(job["params"]),
        parents,
        deadline=request["deadline"],
        rank=rank,
        world_size=request["ranks"],
    )
    channel.install_signal_handlers()
    signal.signal(LAST_RITES, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    store = _artifact_store(request.get("artifacts"))
    try:
        saved = resumed(job["results"], store)
        taken = given(request.get("taken"), store)
    except ValueError as exc:  # an artifact of its checkpoint, or of a call it takes, gone from the store
        raise RankFailed(str(exc)) from exc
    state = job_state(job["params"], saved, job.get("jobman"))
    taking(channel, state, taken)
    outcome = call(fn, state, channel)
    if outcome.status == "FAILED":
        raise RankFailed(outcome.error or "failed")


def _report_for_gang(channel: WorkerChannel, sock: socket.socket, status: str, error: str) -> None:
    """The job's end when another rank ended it: sent between two of rank 0's requests, never inside one.
    Its results are left out (None): the checkpoint rank 0 saved stays the job's."""
    sys.stdout.flush()
    sys.stderr.flush()
    with channel.asking:
        send_msg(sock, {"op": "report", "status": status, "results": None, "error": error})


def _artifact_store(where: str | None) -> Any:
    """The job's artifact store, where its worker says the database keeps it."""
    return open_store(where) if where else None


def function_of(targets: dict[str, Callable[..., Any]], request: dict[str, Any]) -> Callable[..., Any]:
    """The request's function: imported by name, or loaded from the code sent with it (a function run
    by value), each once; a changed function's code is loaded again."""
    target, code = request["target"], request.get("code")
    key = target if code is None else f"{target}\x1f{code}"
    fn = targets.get(key)
    if fn is None:
        fn = resolve(target) if code is None else load_function(base64.b64decode(code), target)
        takes_state_and_channel(fn)  # worked out once here, so each child finds it done
        targets[key] = fn
    return fn


# The code each loaded target runs (its source digest, its tree's git state), worked out once per
# process when the target is first loaded, and told to the worker with the first job it starts.
_code_records = CodeRecords()


def code_of(targets: dict[str, Callable[..., Any]], request: dict[str, Any]) -> dict[str, Any] | None:
    """The code record of the request's function (loaded by :func:`function_of`), for the worker,
    the first time it is asked for only: the worker keeps it for the target's next jobs."""
    target, code = request["target"], request.get("code")
    key = target if code is None else f"{target}\x1f{code}"
    return _code_records.news(key, target, targets[key])


def _discard_pending_stops() -> None:
    """Drop stop signals that came for the job before (they are blocked between jobs)."""
    while signal.sigtimedwait(STOP_SIGNALS, 0) is not None:
        pass


def _job_process(
    targets: dict[str, Callable[..., Any]], request: dict[str, Any], sock: socket.socket, mask: set
) -> None:
    """A fresh job process: the one job it was forked for (what it leaves is ended by the server)."""
    os.setpgid(0, 0)  # a process group of its own: what its job starts dies with it
    _slot.enter()  # and a cgroup, where one can be made
    die_with_parent(oom_score_adj=500)
    send_msg(sock, job_main(function_of(targets, request), request, sock, mask))


def _reused_process(targets: dict[str, Callable[..., Any]], link: socket.socket, mask: set, jobs: int) -> None:
    """A job process that runs up to ``jobs`` jobs, each sent by the worker over ``link``.

    For each: it loads the function (an error is the answer, and it waits for the next job),
    drops any stop signal that came for the job before, says it started, runs the job, ends
    every process the job left, and only then sends the report. The worker signals a job only
    once it has started, so no stop meant for one job reaches the next.
    """
    os.setpgid(0, 0)  # a process group of its own: what its jobs start dies with them
    _slot.drop()  # the server's, for jobs that run alone
    mine = cgroup_of(os.getpid(), _cgroup_folder) if enter_own_cgroup(_cgroup_folder) else None  # and a cgroup
    die_with_parent(oom_score_adj=500)
    become_subreaper()  # what its jobs orphan comes to it, to be ended with the job
    done = 0
    while done < jobs:
        got = recv_msg(link)
        if got is None:  # the worker hung up: it is stopping
            return
        request = got[0]
        if "path" in request:
            sys.path[:] = request["path"]
        try:
            fn = function_of(targets, request)
        except TargetError as exc:
            send_msg(link, {"op": "error", "error": str(exc)})
            continue
        _discard_pending_stops()
        send_msg(link, {"op": "started", "code": code_of(targets, request)})
        report = job_main(fn, request, link, mask)
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        if mine:  # the next job does not inherit this one's processes
            kill_cgroup(mine, remove=False, keep=(os.getpid(),))
        end_job_processes(None)
        done += 1
        send_msg(link, report)


# -- command jobs ------------------------------------------------------------------------------
def _start_command(request: dict[str, Any]) -> int:
    """Fork and exec a command job: in its own process group and cgroup, its output appended to the
    workdir's stdout.txt and stderr.txt. Its pid; OSError if it could not be started."""
    argv, env, workdir = request["argv"], request["env"], request["workdir"]
    failed, report = os.pipe()  # closed by a successful exec; else the reason comes through it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {LAST_RITES})
    pid = os.fork()
    if pid == 0:
        try:
            os.close(failed)
            os.setpgid(0, 0)
            _slot.enter()
            die_with_parent(oom_score_adj=500)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, LAST_RITES, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.chdir(workdir)
            for fd, name, flags in (
                (0, os.devnull, os.O_RDONLY),
                (1, "stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND),
                (2, "stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND),
            ):
                opened = os.open(name, flags, 0o644)
                os.dup2(opened, fd)
                os.close(opened)
            os.closerange(3, report)
            os.closerange(report + 1, 1 << 16)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:  # noqa: BLE001 - said to the server, which says it to the worker
            code = getattr(exc, "errno", None)
            text = str(OSError(code, os.strerror(code), argv[0])) if code else str(exc)
            try:
                os.write(report, text.encode()[:4000])
            except OSError:
                pass
        finally:
            os._exit(127)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(report)
    why = b""
    while True:
        chunk = os.read(failed, 4096)
        if not chunk:
            break
        why += chunk
    os.close(failed)
    if why:
        os.waitpid(pid, 0)
        raise OSError(why.decode(errors="replace"))
    return pid


# -- the server ---------------------------------------------------------------------------
_running_jobs: set[int] = set()  # the job processes alive, whose groups die with the worker
_cgroup_folder: Path | None = None  # where its job processes make their cgroups, if anywhere
# The cgroup that fresh job processes and command jobs enter in turn (one runs at a time); a job
# process that runs several jobs makes its own.
_slot = Slot(None)


def _last_rites(_signum: int, _frame: object) -> None:
    """The worker died: kill the running jobs with all they started, then exit."""
    kill_cgroup(_cgroup_folder)  # every job process's cgroup, and the worker's folder of them
    for pid in list(_running_jobs):
        end_job_processes(pid)
    end_job_processes(None)
    os._exit(0)


def serve(fd: int, worker_pid: int, jobs_per_process: int = 1) -> None:
    """The fork server's loop: one request, one job, its exit status; until the worker hangs up."""
    global _cgroup_folder, _slot
    signal.signal(LAST_RITES, _last_rites)
    if not signal_on_parent_death(LAST_RITES):
        die_with_parent()
    if os.getppid() != worker_pid:  # the worker died before the line above
        os._exit(0)
    become_subreaper()
    if os.environ.get("JOBMAN_JOB_CGROUP", "1") != "0":
        _cgroup_folder = worker_folder(job_cgroup_base(), worker_pid)
        _slot = Slot(_cgroup_folder)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    ctrl = socket.socket(fileno=fd)
    try:
        if jobs_per_process > 1:
            _serve_reused(ctrl, jobs_per_process)
        else:
            _serve_requests(ctrl)
    except ConnectionError:  # the worker was killed (its end of the socket closes before we are)
        pass
    finally:
        kill_cgroup(_cgroup_folder)


def _fork_job(ctrl: socket.socket, run: Callable[[set], None]) -> int:
    """Fork a job process that calls ``run(mask)`` then exits; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    # Blocked until the child has installed its handlers: a SIGTERM sent at once must reach
    # channel.should_stop(), not the disposition (ignore) inherited from the server.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS | {LAST_RITES})
    gc.freeze()  # the server's objects stay out of the job's collections (and its page copies)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            ctrl.close()
            run(mask)
        except BaseException:  # noqa: BLE001 - nothing may escape into the server's loop
            code = 70
        finally:
            os._exit(code)
    try:
        os.setpgid(pid, pid)  # as the child does: whichever runs first
    except OSError:
        pass
    gc.unfreeze()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return pid


def _next_request(
    ctrl: socket.socket, targets: dict[str, Callable[..., Any]], keep: tuple[int, ...] = ()
) -> tuple[dict[str, Any], socket.socket] | bool:
    """The worker's next function job, its function imported here (so every process forked for it
    starts warm), with the socket sent with it; False at the end of the stream, True if the request
    was answered here (an error, or a command job run to its end: ``keep``, the job processes alive)."""
    got = recv_msg(ctrl, with_fds=True)
    if got is None:
        return False
    request, fds = got
    if "path" in request:
        sys.path[:] = request["path"]
    sock = socket.socket(fileno=fds[0])
    if "argv" in request:
        sock.close()
        _serve_command(ctrl, request, keep)
        return True
    try:
        function_of(targets, request)
    except TargetError as exc:
        sock.close()
        send_msg(ctrl, {"error": str(exc)})
        return True
    request["code_record"] = code_of(targets, request)
    return request, sock


def _serve_requests(ctrl: socket.socket) -> None:
    """A fresh process per job: forked, its pid sent, waited for, what it left ended, its exit sent."""
    targets: dict[str, Callable[..., Any]] = {}
    while True:
        got = _next_request(ctrl, targets)
        if got is True:
            continue
        if got is False:
            return
        request, job_sock = got
        slot = _slot.ready()
        pid = _fork_job(ctrl, functools.partial(_job_process, targets, request, job_sock))
        job_sock.close()
        _running_jobs.add(pid)
        send_msg(ctrl, {"pid": pid, "cgroup": str(slot) if slot else None, "code": request["code_record"]})
        status = os.waitpid(pid, 0)[1]
        _slot.empty()
        end_job_processes(pid)
        _running_jobs.discard(pid)  # ended before the worker hears of the end: nothing of the job outlives it
        send_msg(ctrl, {"exit": pid, "status": status})


def _serve_reused(ctrl: socket.socket, jobs_per_process: int) -> None:
    """Job processes that run several jobs: forked on the worker's request with the link the worker
    sends its jobs over; the server only watches them, and sends each one's exit status when it
    ends, once every process it left is ended."""
    targets: dict[str, Callable[..., Any]] = {}
    alive: dict[int, int] = {}  # pid: a descriptor readable when it exits (-1: none, polled)
    try:
        while True:
            watched: list[Any] = [ctrl, *(fd for fd in alive.values() if fd >= 0)]
            ready, _, _ = select.select(watched, [], [], None if all(fd >= 0 for fd in alive.values()) else 0.05)
            for pid, fd in list(alive.items()):
                if fd in ready or fd < 0:
                    done, status = os.waitpid(pid, 0 if fd >= 0 else os.WNOHANG)
                    if done == 0:
                        continue
                    if fd >= 0:
                        os.close(fd)
                    del alive[pid]
                    end_job_processes(pid, keep=tuple(alive), cgroup=cgroup_of(pid, _cgroup_folder))
                    _running_jobs.discard(pid)
                    send_msg(ctrl, {"exit": pid, "status": status})
            if ctrl not in ready:
                continue
            got = _next_request(ctrl, targets, keep=tuple(alive))
            if got is True:
                continue
            if got is False:
                return
            link = got[1]
            pid = _fork_job(ctrl, functools.partial(_reused_process, targets, link, jobs=jobs_per_process))
            link.close()
            _running_jobs.add(pid)
            try:
                alive[pid] = os.pidfd_open(pid)
            except (AttributeError, OSError):
                alive[pid] = -1
            send_msg(ctrl, {"pid": pid, "cgroup": _cgroup_text(pid), "code": got[0]["code_record"]})
    finally:  # the worker hung up: its job processes (idle, or it would be waiting for them) go too
        for pid in alive:
            end_job_processes(pid, keep=tuple(p for p in alive if p != pid), cgroup=cgroup_of(pid, _cgroup_folder))
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _cgroup_text(pid: int) -> str | None:
    """The job process's cgroup, for its worker to kill should this server die first."""
    where = cgroup_of(pid, _cgroup_folder)
    return str(where) if where is not None else None


def _serve_command(ctrl: socket.socket, request: dict[str, Any], keep: tuple[int, ...]) -> None:
    """A command job: started, its pid sent, waited for, everything it started killed, its exit sent."""
    slot = _slot.ready()
    try:
        pid = _start_command(request)
    except OSError as exc:
        send_msg(ctrl, {"error": str(exc)})
        return
    _running_jobs.add(pid)
    send_msg(ctrl, {"pid": pid, "cgroup": str(slot) if slot else None})
    status = os.waitpid(pid, 0)[1]
    _slot.empty()
    end_job_processes(pid, keep=keep)
    _running_jobs.discard(pid)
    send_msg(ctrl, {"exit": pid, "status": status})
