"""Each protection of the sandbox, shown necessary: the generated class's attacks graded
WITHOUT the sandbox and without the memory limit all succeed (they read the masters, run
and overwrite a classmate's notebook, write into the checkout and next to the gradebook,
leave a process behind, allocate 8 GiB and reach a server on the machine), while
tests/test_exercises_pipeline.py shows the same attacks failing in the sandbox. Also unit
checks of the sandbox command and of the wire format the grader reads."""

from __future__ import annotations

import io
import os
import pickle
import signal
import socket
import stat
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import processes_with

from tfbook.course import (
    demo as course_demo,
    grade as course_grade,
    release as course_release,
    sandbox as course_sandbox,
    wire as course_wire,
)

ROOT = Path(__file__).resolve().parents[1]
CH0 = course_demo.CH0
MASTER = ROOT / "notebooks" / f"{CH0}.ipynb"




@pytest.mark.skipif(not MASTER.exists(), reason="chapter 0 not written yet")
def test_attacks_succeed_without_the_sandbox(tmp_path):
    tag = uuid.uuid4().hex[:12]
    rel = course_release.release([MASTER], out=tmp_path / "rel", verbose=False)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    subs, out = tmp_path / "subs", tmp_path / "out"
    course_demo.make_class(subs, rel, out, tag, server.getsockname()[1], names=list(course_demo.ATTACKS),
                           victims=tmp_path / "classmates")
    victim = tmp_path / "classmates" / "ben_wrong" / CH0 / f"{CH0}.ipynb"  # atk_classmate_write's
    victim.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    before = victim.read_bytes()
    marker_checkout = ROOT / "_build" / f"tfbook-attack-{tag}.txt"
    try:
        rows = course_grade.grade(subs, out=out, timeout=20, total_timeout=120, verbose=False,
                            use_sandbox=False, jobs=2,
                            limits=course_sandbox.Limits(memory_bytes=None))
        got = {r.student: r for r in rows}
        for name, score in course_demo.UNSANDBOXED.items():
            assert got[name].score == score, (name, got[name].reason)
            assert course_grade.UNSANDBOXED in got[name].reason  # the loud warning
        assert victim.read_bytes() != before  # a classmate's original was overwritten
        assert marker_checkout.exists()  # the checkout was written to
        assert (out / f"attack-{tag}.txt").exists()  # and the gradebook's folder
        assert processes_with(f"tfbook-detached-{tag}")  # a process outlived the batch
    finally:
        server.close()
        marker_checkout.unlink(missing_ok=True)
        for pid in processes_with(f"tfbook-detached-{tag}"):
            os.kill(pid, signal.SIGKILL)


def test_sandbox_command_isolates():
    cmd = course_sandbox.bwrap_command({"job.json": Path("/tmp/x/job.json")}, ["python"])
    for flag in ("--unshare-net", "--unshare-pid", "--die-with-parent", "--clearenv", "--new-session"):
        assert flag in cmd
    assert "--bind" not in cmd  # nothing of the host is writable
    tmpfs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--tmpfs"]
    assert sorted(tmpfs) == ["/dev/shm", "/grading", "/tmp"]  # fresh, and nothing else
    assert all(cmd[i - 2] == "--size" for i, a in enumerate(cmd) if a == "--tmpfs")  # bounded
    ro = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--ro-bind"]
    assert "/tmp/x/job.json" in ro
    assert str(ROOT) not in ro and str(ROOT / "notebooks") not in ro and str(ROOT / "course") not in ro
    assert str(course_sandbox.PACKAGE) in ro


def test_wire_refuses_what_is_not_plain_data():
    enc = course_wire.encode((np.arange(3, dtype=np.float32), 1.5, "x", None, [True, 2 + 1j]))
    back = course_wire.decode(enc)
    assert back[0].dtype == np.float32 and back[1:4] == (1.5, "x", None)
    with pytest.raises(course_wire.Unencodable):
        course_wire.encode(object())
    with pytest.raises(course_wire.Unencodable):
        course_wire.encode(np.array([object()]))
    # a pickle smuggled in as an array is refused, never unpickled
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    import base64

    with pytest.raises(course_wire.Undecodable):
        course_wire.decode({"t": "ndarray", "npy": base64.b64encode(buf.getvalue()).decode()})
    with pytest.raises(course_wire.Undecodable):
        course_wire.decode({"t": "pickle", "v": base64.b64encode(pickle.dumps(1)).decode()})
    assert course_wire.safe_type_name(type("Leak_1e4", (), {})()) == "an object"


def test_a_checkout_under_tmp_stays_visible(monkeypatch):
    """A CI clone (venv and package) under /tmp must not be hidden by the sandbox's fresh /tmp:
    the read-only binds come after the tmpfs mounted on /tmp."""
    clone = Path("/tmp/some-ci-clone")
    monkeypatch.setattr(course_sandbox, "_read_only_paths", lambda: [clone / ".venv", clone / "tfbook"])
    cmd = course_sandbox.bwrap_command({}, ["true"])
    tmpfs_tmp = max(i for i in range(len(cmd) - 1) if cmd[i] == "--tmpfs" and cmd[i + 1] == "/tmp")
    for path in (clone / ".venv", clone / "tfbook"):
        bind = next(i for i in range(len(cmd) - 2)
                    if cmd[i] == "--ro-bind" and cmd[i + 1] == str(path) and cmd[i + 2] == str(path))
        assert bind > tmpfs_tmp, f"{path} is bound before /tmp is mounted over it"
