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

import nbformat
import numpy as np
import pytest
from conftest import processes_with
from grader_release import released_chapters

from tfbook.course import (
    demo as course_demo,
    grade as course_grade,
    sandbox as course_sandbox,
    wire as course_wire,
)

ROOT = Path(__file__).resolve().parents[1]
CH0 = course_demo.CH0
MASTER = ROOT / "notebooks" / f"{CH0}.ipynb"




@pytest.mark.skipif(not MASTER.exists(), reason="chapter 0 not written yet")
def test_attacks_succeed_without_the_sandbox(tmp_path):
    tag = uuid.uuid4().hex[:12]
    rel = {CH0: released_chapters()[CH0]}  # chapter 0 only: make_class writes every chapter it is given
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
        # two jobs, as `make grade` runs: they share the chapter's judge (issue 28: a judge
        # restarted under one job's evaluation once fed its "ready" to the other's)
        rows = course_grade.grade(subs, out=out, timeout=30, total_timeout=180, verbose=False,
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


def test_wire_refuses_degenerate_arrays():
    """145 bytes that claim 10^12 elements of zero bytes each: refused before the judge sees them."""
    import base64

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|S0", "fortran_order": False, "shape": (10**12,)})
    with pytest.raises(course_wire.Undecodable, match="degenerate"):
        course_wire.decode({"t": "ndarray", "npy": base64.b64encode(buf.getvalue()).decode()})
    ok = course_wire.encode(np.zeros(3, dtype="S2"))
    assert course_wire.decode(ok).shape == (3,)  # the check can pass


def test_in_place_changes_reach_the_replay():
    x, y = np.arange(3.0), {"m": np.ones(2)}
    args, kwargs = (x.copy(),), {"state": {"m": y["m"].copy()}}
    leaves = course_wire.array_leaves(args, kwargs)
    before = course_wire.snapshot(leaves)
    args[0][1] = 7.0  # what a student's function did to its inputs
    kwargs["state"]["m"] *= 3
    changes = [(p, course_wire.decode(e)) for p, e in course_wire.changed_leaves(leaves, before)]
    assert [p for p, _ in changes] == [["a", 0], ["k", "state", "m"]]
    course_wire.apply_changes((x,), {"state": y}, changes)
    assert x.tolist() == [0.0, 7.0, 2.0] and y["m"].tolist() == [3.0, 3.0]
    assert course_wire.changed_leaves(leaves, course_wire.snapshot(leaves)) == []  # unchanged: nothing
    # a list and a tuple with the same items are the same input
    assert course_wire.digest(([1.0, 2.0],), {}) == course_wire.digest(((1.0, 2.0),), {})
    assert course_wire.digest(([1.0, 2.0],), {}) != course_wire.digest(([2.0, 1.0],), {})


def test_student_text_escaped_for_each_medium():
    from tfbook.course import report

    assert report.csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)" and report.csv_cell("ada") == "ada"
    assert report.csv_cell("-1+2") == "'-1+2" and report.csv_cell("\t=1") == " =1"
    assert report.terminal("a\x1b[2Jb\x1b]8;;http://x\x07c\n") == "a [2Jb ]8;;http://x c "
    assert "\u202e" not in report.terminal("name\u202eevil")


def test_policy_finds_a_reference_function_however_imported():
    from tfbook.course import judge, policies

    master = nbformat.read(str(MASTER), as_version=4)
    plan = judge.plan(master, CH0)
    rules = policies.load()
    assert "ex0-1-softmax-tests" in rules

    def student(answer, extra=()):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("from tfbook import numpy as tnp")])
        cell = nbformat.v4.new_code_cell(answer)
        cell.metadata["nbgrader"] = {"grade_id": "ex0-1-softmax", "solution": True}
        nb.cells += [nbformat.v4.new_code_cell(e) for e in extra] + [cell]
        return policies.violations(plan, nb, plan.sources, rules)

    assert student("def softmax(x, axis=-1):\n    return tnp.softmax(x, axis)")  # an alias
    assert student("from tfbook.numpy import softmax as s\nsoftmax = s")
    assert student("def softmax(x, axis=-1):\n    return torch.tensor(x).softmax(axis).numpy()")
    assert student("def softmax(x, axis=-1):\n    return _helper(x, axis)",
                   ["def _helper(x, axis):\n    return tnp.softmax(x, axis)"])  # through a helper
    honest = "def softmax(x, axis=-1):\n    e = np.exp(x - x.max(axis, keepdims=True))\n    return e / e.sum(axis, keepdims=True)"
    assert not student(honest)
    assert not student(honest, ["print(abs(softmax(1.0 * np.arange(3)) - tnp.softmax(1.0 * np.arange(3))).max())"])
    # the same objects by their topic modules' paths, and any alias that reaches them
    assert student("from tfbook.numpy.attention import softmax")
    assert student("import tfbook.numpy.attention as A\ndef softmax(x, axis=-1):\n    return A.softmax(x, axis)")
    assert student("import tfbook\ndef softmax(x, axis=-1):\n    return tfbook.numpy.attention.softmax(x, axis)")
    assert student("from tfbook.torch.functional import attention as FA\n"
                   "def softmax(x, axis=-1):\n    return FA.softmax(torch.as_tensor(x), axis).numpy()")
    assert student("from torch.nn import functional as F\n"
                   "def softmax(x, axis=-1):\n    return F.log_softmax(torch.as_tensor(x), axis).exp().numpy()")
    # a module's other functions are allowed: the check can pass
    assert not student("from tfbook.numpy.attention import causal_mask\n" + honest)
    assert not student("import tfbook.numpy.attention as A\n" + honest)


def test_policy_matches_objects_not_spellings(tmp_path):
    """A policy that names one path (tfbook.numpy.softmax) forbids the object, so every other
    path to it is caught; a name the grader has not imported is never imported because a
    student wrote it."""
    import sys

    from tfbook.course import judge, policies

    rules_file = tmp_path / "policies.py"
    rules_file.write_text('FORBIDDEN = {"ex0-1-softmax-tests": {"calls": ["tfbook.numpy.softmax"], "points": 1,'
                          ' "reason": "uses the reference softmax"}}\n', encoding="utf-8")
    rules = policies.load(rules_file)
    plan = judge.plan(nbformat.read(str(MASTER), as_version=4), CH0)

    def student(answer):
        nb = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell(answer)
        cell.metadata["nbgrader"] = {"grade_id": "ex0-1-softmax", "solution": True}
        nb.cells.append(cell)
        return policies.violations(plan, nb, plan.sources, rules)

    assert student("from tfbook.numpy.attention import softmax")["ex0-1-softmax-tests"]["points"] == 1
    assert student("import tfbook.numpy.attention as A\nsoftmax = A.softmax")
    assert not student("from tfbook.torch.functional.attention import softmax")  # another object: not named
    assert not student("from tfbook.numpy.attention import log_softmax as softmax")
    assert "antigravity" not in sys.modules
    assert not student("import antigravity.softmax as softmax")  # unresolvable: by spelling only
    assert "antigravity" not in sys.modules  # and never imported by the grader


def test_each_sandbox_has_its_own_user_and_budget():
    limits = course_sandbox.Limits()
    if os.geteuid() != 0:
        pytest.skip("per-sandbox users need root")
    slots = course_sandbox.Slots(2, limits)
    try:
        uids = [s.uid for s in slots.all]
        assert len(set(uids)) == 2 and all(u >= course_sandbox.SLOT_UID for u in uids)
        cmd = course_sandbox.bwrap_command({}, ["true"], limits, uid=uids[1])
        assert cmd[cmd.index("TFBOOK_SANDBOX_UID") + 1] == str(uids[1])
        assert course_sandbox.nproc_limit(limits, 2, per_uid=True) == limits.processes
        if slots.cgroups:  # where the system lets root make control groups: one per slot
            s = slots.all[0]
            assert set(s.groups) == set(slots.cgroups)
            assert all(g.is_dir() for g in s.groups.values())
            # a sandbox's leftovers (a fork bomb's children) are gone before the slot is reused
            import subprocess
            import sys

            kids = [subprocess.Popen([sys.executable, "-c", "import os, time\nfor _ in range(20):\n"
                                      "    os.fork() or time.sleep(60)\ntime.sleep(60)"], preexec_fn=s.enter)
                    for _ in range(2)]
            import time

            time.sleep(2)
            where = next(iter(s.groups.values()))
            assert (where / "cgroup.procs").read_text().split()  # the check can fail
            s.kill_all()
            assert (where / "cgroup.procs").read_text().split() == []
            for k in kids:
                k.wait()
    finally:
        slots.remove()
    assert not any(g.exists() for s in slots.all for g in s.groups.values())


def test_a_grader_fault_is_retried_once_and_logged(tmp_path, monkeypatch):
    """An exception in the grader itself (not the student's doing: a fork refused on a loaded
    machine, a judge restarting) gets one fresh try; its traceback goes to the instructor's log."""
    for student in ("ada", "ben"):
        (tmp_path / "subs" / student / CH0).mkdir(parents=True)
        (tmp_path / "subs" / student / CH0 / f"{CH0}.ipynb").write_bytes(MASTER.read_bytes())
    calls = []

    def flaky(row, path, plan, judge, work, **kw):
        calls.append(row.student)
        if calls.count(row.student) == 1 or row.student == "ben":
            raise KeyError("the grader's own fault")
        row.score = 7.0  # as grade_one does, it leaves the status alone unless something went wrong

    monkeypatch.setattr(course_grade, "grade_one", flaky)
    rows = {r.student: r for r in course_grade.grade(tmp_path / "subs", out=tmp_path / "out", verbose=False,
                                                     use_sandbox=False, jobs=2)}
    assert sorted(calls) == ["ada", "ada", "ben", "ben"]  # one retry each, no more
    assert (rows["ada"].score, rows["ada"].status) == (7.0, "graded")
    assert (rows["ben"].score, rows["ben"].status) == (0.0, "error")
    assert "grader: KeyError (see the log)" in rows["ben"].reason
    faults = sorted((tmp_path / "out" / "logs").glob("*.grader-fault.log"))
    assert len(faults) == 3 and all("the grader's own fault" in f.read_text() for f in faults)
