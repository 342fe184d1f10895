"""The sandbox one submission is graded in (bubblewrap), and the limits it runs under.

Inside, a submission sees: the system's programs and libraries (``/usr``, ``/etc``, read
only), this Python and its virtual environment (read only), the installed ``tfbook``
package (read only), and three fresh memory-backed folders of bounded size, gone at the
end: its scratch folder ``/grading`` (with its job, the notebook's cells, read only),
``/tmp`` and ``/dev/shm``. Nothing it writes reaches the host's disk.
The virtual environment and the package appear at neutral paths (``/opt/tfbook/venv``,
``/opt/tfbook/src``; an editable install's path hook and ``direct_url.json``, which name the
checkout, are covered by empty files), so the student's code does not learn where the checkout
or the gradebook is from its own paths. The job's files are copied in by bubblewrap, not bound,
so ``/proc/self/mountinfo`` names no path of the grader's temporary folder, the class or the
gradebook; it still names the host folder each *bind* mount comes from (the system's folders,
the venv's and the package's, hence the checkout's when the venv or an editable install is
inside it): the kernel writes the source's path within its file system there, which no mount
option changes, and hiding it would mean copying the venv for every sandbox or covering
``/proc`` (which the driver and the libraries read). Keep the venv and the package outside
the checkout to hide that too. Its standard error is a pipe to the grader, never
a file of the host. Nothing else: not the project checkout, not the master notebooks, not the grader's
course folder, not another submission, not the gradebook, not the network
(``--unshare-net``: only a loopback interface). It runs in its own PID namespace with
``--die-with-parent``: when grading ends, or the grader dies, every process it started
(daemons and double forks included) is killed with it.

Limits (``Limits``): address space for data (``RLIMIT_DATA``, default 4 GiB, so an
8 GiB allocation raises ``MemoryError``), CPU seconds (``RLIMIT_CPU``), processes and
threads of the sandbox user (``RLIMIT_NPROC``), size of any file written
(``RLIMIT_FSIZE``), plus the grader's own time limits per cell and per notebook, which
:class:`Meter` measures so that they do not shrink when the machine is loaded: CPU
seconds of all the sandbox's processes, and a backstop on wall-clock seconds *less the
time the sandbox waited for a CPU* (the kernel's run-queue delay), for code that sleeps
or blocks.

Each submission is alone (:class:`Slots`): when the grader runs as root, each of the
``--jobs`` sandboxes running at once has a user of its own (uids 200000 + slot, which own
nothing on the host), so ``RLIMIT_NPROC`` (a per-user count) is that sandbox's budget: a fork
bomb exhausts its own processes, never a classmate's. Where the system lets the grader create
control groups (cgroup v1 or v2, ``memory`` and ``pids``), each slot also gets one: a memory
limit for all of the sandbox's processes together (RLIMIT_DATA is per process), a process
limit, and a trusted measure of the sandbox's peak memory. Without root or cgroups the
sandboxes share one user and the per-process limits (said in the README).

Where bubblewrap is missing (macOS) or does not work, :func:`available` says why, and
the grader runs the driver as a plain subprocess with the same limits and a loud
warning in the console and in every row of grades.csv.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import tfbook

PACKAGE = Path(tfbook.__file__).resolve().parent
SANDBOX_UID = 65534  # nobody (without slots)
SLOT_UID = 200000  # + slot: one user per sandbox running at once
INSIDE = "/grading"  # where the scratch folder appears inside the sandbox
SYSTEM = ["/usr", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/opt/conda"]


@dataclass
class Limits:
    memory_bytes: int | None = 4 * 2**30  # None: no limit
    cpu_seconds: int = 900
    processes: int = 128
    file_bytes: int = 64 * 2**20
    scratch_bytes: int = 256 * 2**20  # each of /grading and /tmp (memory-backed)
    shm_bytes: int = 64 * 2**20


def bwrap_path() -> str | None:
    return shutil.which("bwrap") or ("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else None)


@lru_cache(maxsize=1)
def available() -> str:
    """'' when bubblewrap works here, else why not (for the warning)."""
    path = bwrap_path()
    if sys.platform != "linux":
        return f"bubblewrap needs Linux (this is {sys.platform})"
    if path is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
             "--die-with-parent", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap does not run here ({type(exc).__name__})"
    if done.returncode != 0:
        return f"bwrap does not work here: {done.stderr.decode(errors='replace').strip()[:200]}"
    return ""


def install_bwrap() -> bool:
    """Install Debian's bubblewrap with apt-get (as root or with sudo); True if it worked."""
    if bwrap_path() or sys.platform != "linux" or not shutil.which("apt-get"):
        return bool(bwrap_path())
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "bubblewrap"]):
        if subprocess.run(sudo + cmd, env=env, capture_output=True).returncode != 0:
            return False
    available.cache_clear()
    return bool(bwrap_path())


VENV_INSIDE = "/opt/tfbook/venv"  # where the virtual environment appears in the sandbox
SRC_INSIDE = "/opt/tfbook/src"  # the package, at SRC_INSIDE/tfbook, where it is not in the venv


def _inside(path: Path) -> str:
    """Where a host path bound read-only appears in the sandbox: the venv and the package at
    neutral paths (the student's code never learns where the checkout is), anything else
    (the system's Python) where it is."""
    path = Path(path)
    venv = Path(sys.prefix).resolve()
    if venv != Path(sys.base_prefix).resolve() and (path == venv or venv in path.parents):
        return VENV_INSIDE + str(path)[len(str(venv)):]
    if path == PACKAGE or PACKAGE in path.parents:
        return f"{SRC_INSIDE}/{PACKAGE.name}" + str(path)[len(str(PACKAGE)):]
    return str(path)


def python_inside() -> str:
    """This Python's executable as the sandbox sees it (through the venv's neutral path)."""
    exe = Path(sys.executable)
    venv = Path(sys.prefix)
    if sys.prefix != sys.base_prefix and venv in exe.parents:
        return VENV_INSIDE + str(exe)[len(str(venv)):]
    return str(exe)


@lru_cache(maxsize=1)
def _blanked() -> tuple[str, ...]:
    """Files of the venv that would tell the sandbox where the checkout is (an editable install's
    path hook and its .pth, its direct_url.json), as the sandbox sees them: each is covered by
    an empty file (the package is found on PYTHONPATH instead)."""
    checkout = str(PACKAGE.parent)
    if sys.prefix == sys.base_prefix:
        return ()
    found, modules = [], []
    for site in Path(sys.prefix).glob("lib/python3*/site-packages"):
        candidates = [*site.glob("*.py"), *site.glob("*.dist-info/direct_url.json"), *site.glob("*.egg-link")]
        for f in candidates:
            try:
                if checkout in f.read_text(encoding="utf-8", errors="replace"):
                    found.append(f)
                    if f.suffix == ".py":
                        modules.append(f.stem)
            except OSError:
                continue
        for f in site.glob("*.pth"):
            try:
                text = f.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if checkout in text or any(m in text for m in modules):
                found.append(f)
    return tuple(_inside(f.resolve()) if f.resolve().is_relative_to(Path(sys.prefix).resolve())
                 else _inside(f) for f in found)


@lru_cache(maxsize=1)
def _font_cache_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="tfbook-fontcache-")


def sandbox_font_caches() -> list[Path]:
    """matplotlib's font caches with the venv's paths as the sandbox sees them (a cache naming
    fonts that are not there would be rebuilt, seconds in every sandbox)."""
    out = []
    venv = str(Path(sys.prefix))
    for f in font_caches():
        dest = Path(_font_cache_dir()) / f.name
        if not dest.exists():
            text = f.read_text(encoding="utf-8", errors="replace")
            if sys.prefix != sys.base_prefix:
                text = text.replace(venv + "/", VENV_INSIDE + "/")
            tmp = dest.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.chmod(tmp, 0o644)
            tmp.replace(dest)
        out.append(dest)
    return out


def _read_only_paths() -> list[Path]:
    paths = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(),
             Path(sys.executable).resolve().parent.parent, PACKAGE}
    return sorted(paths)


def environment(scratch_inside: str) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    return {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": scratch_inside,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": f"{scratch_inside}/.matplotlib",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TFBOOK_DEVICE": "cpu",
        "JUPYTER_PLATFORM_DIRS": "1",
        "IPYTHONDIR": f"{scratch_inside}/.ipython",
    }


def bwrap_command(files: dict[str, Path], argv: list[str], limits: Limits | None = None,
                  uid: int = SANDBOX_UID, fds: list[int] | None = None) -> list[str]:
    """The bwrap command line that runs ``argv`` in the sandbox.

    ``files`` maps paths relative to /grading to host files put there read-only (the
    job, matplotlib's font cache). /grading itself, /tmp and /dev/shm are fresh tmpfs
    of bounded size: nothing the submission writes reaches the host's disk.

    With ``fds`` (a list the caller owns), each file is opened here, its descriptor appended to
    ``fds``, and bubblewrap copies it into the sandbox (``--ro-bind-data``) instead of binding the
    host file: ``/proc/self/mountinfo`` then names bubblewrap's own deleted copy, not the host
    path of the grader's temporary folder. The caller passes ``fds`` to the process
    (``pass_fds``) and closes them once it started."""
    limits = limits or Limits()
    cmd = [bwrap_path()]
    made: set[str] = {"/"}
    bound: list[str] = []
    for p in SYSTEM:
        if os.path.islink(p):
            cmd += ["--symlink", os.readlink(p), p]
            made.add(p)
        elif os.path.isdir(p):
            cmd += ["--ro-bind", p, p]
            made.add(p)
            bound.append(p)
    # /proc, /dev and the scratch /tmp and /dev/shm come before the read-only binds of the
    # venv and the package: a checkout or venv under /tmp (a CI clone) would otherwise be
    # hidden by the fresh /tmp mounted over it.
    cmd += ["--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(limits.scratch_bytes), "--tmpfs", "/tmp",
            "--perms", "1777", "--size", str(limits.shm_bytes), "--tmpfs", "/dev/shm"]
    made.update({"/proc", "/dev", "/tmp", "/dev/shm"})
    for p in _read_only_paths():
        if any(str(p) == b or str(p).startswith(b + "/") for b in bound):
            continue
        inside = Path(_inside(p))
        for parent in reversed(inside.parents):
            if str(parent) not in made:
                cmd += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        cmd += ["--ro-bind", str(p), str(inside)]
        made.add(str(inside))
        bound.append(str(p))
    for f in _blanked():
        cmd += ["--ro-bind", "/dev/null", f]
    cmd += ["--perms", "1777", "--size", str(limits.scratch_bytes), "--tmpfs", INSIDE]
    for rel in sorted(files):
        parent = str(Path(INSIDE, rel).parent)
        if parent != INSIDE and parent not in made:
            cmd += ["--perms", "1777", "--dir", parent]
            made.add(parent)
        if fds is None:
            cmd += ["--ro-bind", str(files[rel]), f"{INSIDE}/{rel}"]
        else:
            fds.append(os.open(files[rel], os.O_RDONLY | os.O_CLOEXEC))
            cmd += ["--perms", "0444", "--ro-bind-data", str(fds[-1]), f"{INSIDE}/{rel}"]
    cmd += ["--chdir", INSIDE,
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
    if os.geteuid() == 0:
        # the driver drops to `nobody` itself, before any student code runs
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                "--setenv", "TFBOOK_SANDBOX_UID", str(uid)]
    else:
        cmd += ["--unshare-user"]
    env = environment(INSIDE)
    env["PATH"] = f"{Path(python_inside()).parent}:/usr/local/bin:/usr/bin:/bin"
    if _inside(PACKAGE).startswith(SRC_INSIDE):
        env["PYTHONPATH"] = SRC_INSIDE
    for k, v in env.items():
        cmd += ["--setenv", k, v]
    return cmd + ["--"] + argv


def _own_process_count() -> int:
    uid, n = os.getuid(), 0
    for d in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if d.isdigit():
            try:
                n += len(os.listdir(f"/proc/{d}/task")) if os.stat(f"/proc/{d}").st_uid == uid else 0
            except OSError:
                pass
    return n


def preexec(limits: Limits, processes: int | None, slot: "Slot | None" = None):
    """A preexec_fn setting the limits in the child before it execs the sandbox.

    In the sandbox every limit must hold (an error stops the child, and the row says the
    sandbox did not start); without it (macOS) a limit the system refuses is skipped."""
    strict = sys.platform == "linux"

    def setlimit(kind, value):
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):
            if strict:
                raise

    def apply():
        os.setsid()
        if slot is not None:
            slot.enter()  # this process and all it starts: the slot's control groups
        if limits.memory_bytes is not None:
            setlimit(resource.RLIMIT_DATA, limits.memory_bytes)
        setlimit(resource.RLIMIT_CPU, limits.cpu_seconds)
        setlimit(resource.RLIMIT_FSIZE, limits.file_bytes)
        setlimit(resource.RLIMIT_CORE, 0)
        if processes is not None:
            setlimit(resource.RLIMIT_NPROC, processes)

    return apply


def nproc_limit(limits: Limits, jobs: int, per_uid: bool = False) -> int | None:
    """RLIMIT_NPROC counts every process and thread of the user: as root with slots each
    sandbox has its own user (its own budget); as root without, `nobody` (shared by the
    parallel jobs); otherwise this user, who has others (counted in /proc; without /proc, no limit)."""
    if not os.path.isdir("/proc"):
        return None
    if os.geteuid() == 0:
        return limits.processes if per_uid else limits.processes * max(jobs, 1)
    return _own_process_count() + limits.processes * max(jobs, 1)


def font_caches() -> list[Path]:
    """matplotlib's font cache files (building one takes seconds in every fresh sandbox)."""
    for cache in (Path(os.environ.get("MPLCONFIGDIR", "") or "/nonexistent"),
                  Path.home() / ".cache" / "matplotlib", Path.home() / ".matplotlib"):
        found = sorted(cache.glob("fontlist-*.json")) if cache.is_dir() else []
        if found:
            return found
    return []


def prepare_scratch(scratch: Path) -> None:
    """Create the grader's folder for one run. Unsandboxed, it is also the run's working
    folder, with matplotlib's font cache copied in; in the sandbox it is never mounted."""
    scratch.mkdir(parents=True, exist_ok=True)
    mpl = scratch / ".matplotlib"
    mpl.mkdir(exist_ok=True)
    for f in font_caches():
        shutil.copyfile(f, mpl / f.name)


# --------------------------------------------------------------------------- one budget per sandbox


def _own_cgroup(controller: str) -> Path | None:
    """Where this process's control group of ``controller`` is (v1), or the unified one (v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            base = Path("/sys/fs/cgroup") / controller
            if base.is_dir():
                return base / path.lstrip("/")
    v2_name = {"cpuacct": "cpu"}.get(controller, controller)  # v2 accounts CPU in its cpu controller
    for line in lines:  # v2
        if line.startswith("0::"):
            base = Path("/sys/fs/cgroup")
            if (base / "cgroup.controllers").is_file():
                where = base / line[3:].lstrip("/")
                ctrls = (where / "cgroup.subtree_control").read_text().split() if \
                    (where / "cgroup.subtree_control").is_file() else []
                return where if v2_name in ctrls else None
    return None


def _write(path: Path, value) -> bool:
    try:
        path.write_text(str(value))
        return True
    except OSError:
        return False


class Slot:
    """One of the sandboxes that run at once: its user and, where possible, its control groups."""

    def __init__(self, index: int, limits: Limits, tag: str):
        self.index = index
        self.uid = SLOT_UID + index if os.geteuid() == 0 else None
        self.groups: dict[str, Path] = {}
        if os.geteuid() != 0 or sys.platform != "linux":
            return
        for controller in ("memory", "pids", "cpuacct"):
            base = _own_cgroup(controller)
            if base is None:
                continue
            where = base / f"{tag}-{index}"
            try:
                where.mkdir(exist_ok=True)
            except OSError:
                continue
            v2 = not (where / "tasks").exists()  # a v1 group has a tasks file
            ok = True
            if controller == "memory" and limits.memory_bytes is not None:
                ok = _write(where / ("memory.max" if v2 else "memory.limit_in_bytes"), limits.memory_bytes)
                if not v2:
                    _write(where / "memory.memsw.limit_in_bytes", limits.memory_bytes)  # no swapping out
            if controller == "pids":
                ok = _write(where / "pids.max", limits.processes)
            if ok:
                self.groups[controller] = where
            else:
                try:
                    where.rmdir()
                except OSError:
                    pass

    def enter(self) -> None:
        """In the child, before it execs the sandbox: join the slot's control groups."""
        for where in self.groups.values():
            with open(where / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def reset_peak(self) -> None:
        where = self.groups.get("memory")
        if where is not None:
            _write(where / "memory.max_usage_in_bytes", 0) or _write(where / "memory.peak", 0)

    def usage(self) -> int | None:
        """The sandbox's memory now (all its processes), measured by the kernel."""
        where = self.groups.get("memory")
        for name in ("memory.usage_in_bytes", "memory.current"):
            try:
                return int((where / name).read_text().split()[0]) if where is not None else None
            except (OSError, ValueError, IndexError):
                continue
        return None

    def peak(self) -> int | None:
        """The sandbox's peak memory (all its processes) since the last reset, measured by the kernel."""
        where = self.groups.get("memory")
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            try:
                return int((where / name).read_text().split()[0]) if where is not None else None
            except (OSError, ValueError, IndexError):
                continue
        return None

    def cpu_seconds(self) -> float | None:
        """CPU seconds (user + system) all of the slot's processes have used, ended ones
        included, measured by the kernel (cpuacct, or v2's cpu.stat); None without the group."""
        where = self.groups.get("cpuacct")
        if where is None:
            return None
        try:
            if (where / "cpuacct.usage").is_file():
                return int((where / "cpuacct.usage").read_text().split()[0]) / 1e9
            for line in (where / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
        except (OSError, ValueError, IndexError):
            pass
        return None

    def kill_all(self, wait: float = 10.0) -> None:
        """Every process left in the slot's groups (a sandbox's leftovers) is killed, and waited
        for (up to ``wait`` seconds): a fork bomb's dying processes still count against the
        slot's process limit, and the next submission in this slot must not inherit them."""
        deadline = time.monotonic() + wait
        while True:
            left = 0
            for where in self.groups.values():
                try:
                    pids = [int(x) for x in (where / "cgroup.procs").read_text().split()]
                except (OSError, ValueError):
                    continue
                left += len(pids)
                for pid in pids:
                    try:
                        os.kill(pid, 9)
                    except OSError:
                        pass
            if not left or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def remove(self) -> None:
        self.kill_all()
        for where in dict.fromkeys(self.groups.values()):  # cgroup v2: one folder for every controller
            for _ in range(50):
                try:
                    where.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


class Slots:
    """``jobs`` slots, handed to the submissions being graded (one slot per running sandbox)."""

    def __init__(self, jobs: int, limits: Limits):
        import queue

        tag = f"tfbook-grade-{os.getpid()}"
        self.all = [Slot(i, limits, tag) for i in range(jobs)]
        self.free: "queue.Queue[Slot]" = queue.Queue()
        for s in self.all:
            self.free.put(s)

    @property
    def cgroups(self) -> list[str]:
        return sorted({c for s in self.all for c in s.groups})

    def acquire(self) -> Slot:
        return self.free.get()

    def release(self, slot: Slot) -> None:
        slot.kill_all()
        self.free.put(slot)

    def remove(self) -> None:
        for s in self.all:
            s.remove()


# --------------------------------------------------------------------------- time that load does not shrink


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace")
    except OSError:
        return None


def run_queue_delays_available() -> bool:
    """Whether the kernel says how long each thread waited for a CPU (/proc/<pid>/schedstat)."""
    text = _read(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat")
    return bool(text) and len(text.split()) >= 2


def process_tree(root: int) -> list[int]:
    """``root`` and every process under it, alive now (Linux /proc; [] elsewhere). In the
    sandbox's PID namespace an orphan is adopted by the sandbox's own init, so no process the
    sandbox starts leaves the tree."""
    if not os.path.isdir(f"/proc/{root}"):
        return []
    if _read(f"/proc/{root}/task/{root}/children") is None:  # no CONFIG_PROC_CHILDREN: scan /proc
        parent = {}
        for d in os.listdir("/proc"):
            stat_ = _read(f"/proc/{d}/stat") if d.isdigit() else None
            if stat_:
                try:
                    parent[int(d)] = int(stat_.rsplit(")", 1)[1].split()[1])
                except (IndexError, ValueError):
                    pass
        out, todo = [], [root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo += [c for c, p in parent.items() if p == pid and c not in out]
        return out
    out, todo, seen = [], [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            todo += [int(c) for c in (_read(f"/proc/{pid}/task/{tid}/children") or "").split()]
    return out


class Meter:
    """The time a sandbox (a process and every process under it) has used since the meter
    started, measured so that a loaded machine does not use it up:

    - ``cpu``: CPU seconds, user + system, of all its processes and threads (ended ones too:
      a reaped child's time is in its parent's), or the slot's control group's count where
      there is one (which no process can leave);
    - ``own``: wall-clock seconds less the time it waited for a CPU: per interval between two
      samples, the interval less the longest run-queue delay any of its threads had in it
      (/proc/<pid>/task/<tid>/schedstat). A process that computes accrues about its CPU time,
      one that sleeps or blocks accrues wall time, and neither accrues the time others' work
      kept it off a core. Where the kernel gives no run-queue delay (``fair`` False), ``own``
      is plain wall-clock time.

    ``sample()`` brings both up to date (the grader calls it every fraction of a second)."""

    def __init__(self, pid: int, slot: "Slot | None" = None):
        self.pid, self.slot = pid, slot
        self.fair = run_queue_delays_available()
        self.cpu = self.own = 0.0
        self._t = time.monotonic()
        self._delays: dict[int, int] = {}
        self._slot0 = slot.cpu_seconds() if slot is not None else None
        self._tree0 = None
        self.sample()

    def _tree_cpu_and_delays(self) -> tuple[float, dict[int, int]]:
        ticks, delays = 0, {}
        for pid in process_tree(self.pid):
            text = _read(f"/proc/{pid}/stat")
            try:
                f = text.rsplit(")", 1)[1].split()
                ticks += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
            except (AttributeError, IndexError, ValueError):
                continue
            if not self.fair:
                continue
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                sched = _read(f"/proc/{pid}/task/{tid}/schedstat")
                try:
                    delays[int(tid)] = int(sched.split()[1])
                except (AttributeError, IndexError, ValueError):
                    pass
        return ticks / _CLK_TCK, delays

    def sample(self) -> "Meter":
        now = time.monotonic()
        dt, self._t = now - self._t, now
        tree_cpu, delays = self._tree_cpu_and_delays()
        if self._tree0 is None:  # the first sample: where both clocks start
            self._tree0, self._delays = tree_cpu, delays
            return self
        cpu = tree_cpu - self._tree0
        if self._slot0 is not None:
            used = self.slot.cpu_seconds()
            cpu = max(cpu, (used - self._slot0) if used is not None else 0.0)
        self.cpu = max(self.cpu, cpu)
        waited = max((d - self._delays.get(t, 0) for t, d in delays.items()), default=0) / 1e9
        self.own += dt - min(max(waited, 0.0), dt) if self.fair else dt
        self._delays = delays
        return self


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
