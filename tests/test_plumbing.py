"""The process plumbing's bottom modules: the message format and the lifetime helpers stand on the
standard library alone, and the format round-trips whole and split messages."""

from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jobman.dispatch import lifetime
from jobman.dispatch.messages import Frames, recv_msg, send_msg

DISPATCH = Path(__file__).resolve().parent.parent / "dispatch"
STDLIB_ONLY = ("messages.py", "lifetime.py")


@pytest.mark.parametrize("name", STDLIB_ONLY)
def test_the_bottom_modules_import_nothing_of_jobman(name):
    tree = ast.parse((DISPATCH / name).read_text())
    ours = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "jobman"):
            ours.append(node.module)
        elif isinstance(node, ast.Import):
            ours += [a.name for a in node.names if a.name.split(".")[0] == "jobman"]
    assert ours == []
    for module in [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + [
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    ]:
        top = module.split(".")[0]
        assert top in sys.stdlib_module_names or top in ("__future__", "psutil"), module


def test_a_message_goes_whole_with_its_descriptors():
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        send_msg(a, {"op": "save", "results": {"loss": 0.5, "name": "é"}}, [w])
        message, fds = recv_msg(b, with_fds=True)
        assert message == {"op": "save", "results": {"loss": 0.5, "name": "é"}}
        assert len(fds) == 1
        os.write(fds[0], b"x")
        assert os.read(r, 1) == b"x"
        os.close(fds[0])
        send_msg(a, {"op": "log", "step": 1})
        assert recv_msg(b) == ({"op": "log", "step": 1}, [])
        a.close()
        assert recv_msg(b) is None  # the end of the stream
    finally:
        for fd in (r, w):
            os.close(fd)
        b.close()


def test_frames_wait_for_the_rest_of_a_split_message():
    a, b = socket.socketpair()
    with a, b:
        send_msg(a, {"op": "report", "status": "DONE"})
        send_msg(a, {"op": "log", "step": 1})
        data = b.recv(1 << 16)
    frames = Frames()
    assert list(frames.feed(data[:3])) == []
    assert list(frames.feed(data[3:20])) == []
    assert list(frames.feed(data[20:])) == [{"op": "report", "status": "DONE"}, {"op": "log", "step": 1}]
    assert frames.buffer == bytearray()


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")
def test_a_child_that_asked_dies_with_its_parent(tmp_path):
    """A middle process asks for SIGKILL at its parent's death and becomes a subreaper; its parent
    (the test's child) is killed: the middle one goes too."""
    script = tmp_path / "chain.py"
    script.write_text(f"""
import os, sys, time
sys.path[:] = {sys.path!r}
from jobman.dispatch.lifetime import die_with_parent, become_subreaper
pid = os.fork()
if pid == 0:
    die_with_parent()
    assert become_subreaper()
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
""")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    middle = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(500):
        try:
            os.kill(middle, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{middle}/stat").read_text().split(")")[1].split()[0] == "Z":
            break  # dead, waiting for init to reap it
        import time

        time.sleep(0.01)
    else:
        pytest.fail("the child outlived its parent")


def test_kill_children_ends_every_child_but_those_kept():
    kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert {kept.pid, gone.pid} <= set(lifetime.child_pids())
        assert lifetime.kill_children(keep=tuple(p for p in lifetime.child_pids() if p != gone.pid)) == 1
        assert gone.pid not in lifetime.child_pids()
        assert kept.poll() is None
    finally:
        kept.kill()
        kept.wait()
        try:
            gone.wait(timeout=1)
        except ChildProcessError:
            pass


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc")
def test_a_process_start_time_tells_it_from_a_later_one():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = lifetime.start_ticks(child.pid)
        assert isinstance(ticks, int) and ticks >= lifetime.start_ticks(os.getpid())
        assert lifetime.start_ticks(child.pid) == ticks
    finally:
        child.kill()
        child.wait()
    assert lifetime.start_ticks(child.pid) is None or lifetime.start_ticks(child.pid) != ticks
