"""What is under SUBMISSIONS_DIR (:func:`find_work`): a row for every student's assignment, with
the notebook's code read without following a symbolic link (its outputs dropped), or the status
and reason why it cannot be graded."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from tfbook.course.job import read_submission
from tfbook.course.rows import NO_ASSIGNMENT, Row

# Everything under SUBMISSIONS_DIR is the students': a symbolic link is never followed (it could
# point at the master notebooks, /etc/passwd or a classmate's folder), and is reported as such;
# the same folder reached twice (a bind mount, a hard-linked notebook) is graded once.


def _lstat(path: Path):
    try:
        return os.lstat(path)
    except OSError:
        return None


def _entries(folder: Path) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of a folder's entries, sorted, without following anything."""
    out = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        st = _lstat(folder / name)
        if st is not None:
            out.append((name, st))
    return out


def _find_submission(folder: Path, assignment: str) -> tuple[Path | None, str, str]:
    """(the notebook, a note for the reason, or the status and reason why there is none)."""
    entries = dict(_entries(folder))
    want = f"{assignment}.ipynb"
    if want in entries:
        st = entries[want]
        if stat.S_ISLNK(st.st_mode):
            return None, "refused", f"{want} is a symbolic link: not followed, not graded"
        if stat.S_ISREG(st.st_mode):
            return folder / want, "", ""
        return None, "missing", f"{want} is not a file"
    others = [n for n, st in entries.items() if n.endswith(".ipynb") and stat.S_ISREG(st.st_mode)]
    links = [n for n, st in entries.items() if n.endswith(".ipynb") and stat.S_ISLNK(st.st_mode)]
    if len(others) == 1 and not links:
        return folder / others[0], f"the notebook had another name; graded as {want}", ""
    if links and not others:
        return None, "refused", "the notebook is a symbolic link: not followed, not graded"
    return None, "missing", f"no {want} in the assignment's folder"


MAX_NOTEBOOK = 512 * 2**20  # bytes: a notebook file larger than this is not read (its outputs are dropped)


def _strip_outputs(data: bytes) -> bytes:
    """The notebook without its cells' outputs and attachments (what is graded is the code, which
    runs again in the sandbox): a notebook whose outputs are hundreds of megabytes is graded like
    any other, and only its code is kept in memory. Bytes that are not notebook JSON are returned
    as they are (:func:`_readable` says why they are not a notebook)."""
    try:
        nb = json.loads(data)
    except (ValueError, RecursionError):
        return data
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        return data
    for cell in cells:
        if isinstance(cell, dict):
            if "outputs" in cell:
                cell["outputs"] = []
            cell.pop("attachments", None)
    return json.dumps(nb, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _read_notebook(path: Path) -> tuple[bytes | None, str]:
    """The notebook's bytes without its outputs (opened without following a symbolic link, a
    plain file only), or why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None, "cannot be opened (a symbolic link, or not readable)"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a plain file"
        if st.st_size > MAX_NOTEBOOK:
            return None, f"larger than {MAX_NOTEBOOK // 2**20} MiB"
        chunks, size = [], 0
        while size <= MAX_NOTEBOOK:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        del chunks
        return _strip_outputs(data), ""
    finally:
        os.close(fd)


def _readable(data: bytes) -> str:
    """'' if ``data`` is a notebook, else why not: fixed words, never the file's content (a
    parser's message quotes it)."""
    if not data.strip():
        return "empty file"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    try:
        nb = read_submission(text)
    except Exception:  # noqa: BLE001  (json.JSONDecodeError, nbformat validation, ...)
        return "not a notebook (not valid notebook JSON)"
    if not isinstance(nb.get("cells"), list):
        return "not a notebook (no cells)"
    return ""


def find_work(submissions: Path, notebooks_dir: Path) -> list[tuple[Row, Path | None, str, bytes | None]]:
    """Every (row, notebook, note, bytes) under ``submissions``, sorted by assignment then student;
    rows that cannot be graded come with their status and reason set and no notebook."""
    out = []
    seen: dict[tuple[int, int], str] = {}
    for s, st in _entries(submissions):
        if stat.S_ISLNK(st.st_mode):
            out.append((Row(s, NO_ASSIGNMENT, status="refused",
                            reason="the student's folder is a symbolic link: not followed, not graded"), None, "", None))
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        if s.startswith("."):
            out.append((Row(s, NO_ASSIGNMENT, status="skipped",
                            reason="a hidden folder (its name starts with a dot): not graded"), None, "", None))
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            out.append((Row(s, NO_ASSIGNMENT, status="refused",
                            reason="the same folder as another student's: graded once"), None, "", None))
            continue
        seen[key] = s
        for a, ast_ in _entries(submissions / s):
            if stat.S_ISLNK(ast_.st_mode):
                out.append((Row(s, a, status="refused",
                                reason="the assignment's folder is a symbolic link: not followed, not graded"),
                            None, "", None))
                continue
            if not stat.S_ISDIR(ast_.st_mode) or a.startswith("."):
                continue
            row = Row(s, a)
            folder = submissions / s / a
            if not _CHAPTER.fullmatch(a) or not (Path(notebooks_dir) / f"{a}.ipynb").is_file():
                row.status, row.reason = "unknown-assignment", "no chapter notebook of that name"
                out.append((row, None, "", None))
                continue
            path, note, why = _find_submission(folder, a)
            if path is None:
                row.status, row.reason = note, why
                out.append((row, None, "", None))
                continue
            fst = _lstat(path)
            fkey = (fst.st_dev, fst.st_ino) if fst else None
            if fkey in seen:
                row.status, row.reason = "refused", "the same notebook file as another student's: graded once"
                out.append((row, None, "", None))
                continue
            if fkey:
                seen[fkey] = s
            data, why = _read_notebook(path)
            problem = why or _readable(data)
            if problem:
                row.status, row.reason = "unreadable", problem
                data = None
            out.append((row, path if data is not None else None, note, data))
    out.sort(key=lambda item: (item[0].assignment, item[0].student))
    return out


_CHAPTER = re.compile(r"(\d\d|[A-Z])_[a-z0-9_]+")


__all__ = ["find_work", "MAX_NOTEBOOK"]
