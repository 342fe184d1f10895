"""A class graded in two shards (``grade --shard k/2``, as a Slurm array or a CI matrix would)
and joined with ``merge`` gives the same grades.csv as one run; the shards split the class
without overlap; a bad shard is refused."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from grader_release import released_chapters

from tfbook.course import demo, grade, sandbox, shards

ROOT = Path(__file__).resolve().parents[1]
MASTER = ROOT / "notebooks" / f"{demo.CH0}.ipynb"
STUDENTS = ("ada_correct", "ben_wrong")  # one per shard

pytestmark = pytest.mark.skipif(not MASTER.exists(), reason="chapter 0 not written yet")


def test_parse_shard_refuses_nonsense():
    assert shards.parse_shard("2/3") == (2, 3) and shards.parse_shard(None) == (1, 1)
    for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
        with pytest.raises(ValueError, match="--shard"):
            shards.parse_shard(bad)


def test_two_shards_merged_equal_one_run(tmp_path):
    if sandbox.available():
        pytest.skip(sandbox.available())
    rel = {demo.CH0: released_chapters()[demo.CH0]}  # chapter 0 only: make_class writes every chapter it is given
    subs = tmp_path / "subs"
    demo.make_class(subs, rel, tmp_path / "x", "shards", 9, names=list(STUDENTS))
    one = grade.grade(subs, out=tmp_path / "one", timeout=30, total_timeout=120, verbose=False, jobs=2)
    parts = [grade.grade(subs, out=tmp_path / f"part{k}", timeout=30, total_timeout=120, verbose=False,
                         jobs=1, shard=f"{k}/2") for k in (1, 2)]
    keys = [{(r.student, r.assignment) for r in p} for p in parts]
    assert keys[0] and keys[1] and not keys[0] & keys[1]  # both shards have work, none twice
    assert keys[0] | keys[1] == {(r.student, r.assignment) for r in one}
    shards.merge([tmp_path / "part1", tmp_path / "part2"], tmp_path / "merged", verbose=False)
    one_csv = (tmp_path / "one" / "grades.csv").read_text(encoding="utf-8")
    assert (tmp_path / "merged" / "grades.csv").read_text(encoding="utf-8") == one_csv
    assert (tmp_path / "merged" / "exercises.csv").read_text(encoding="utf-8") == \
        (tmp_path / "one" / "exercises.csv").read_text(encoding="utf-8")
    assert sorted(p.relative_to(tmp_path / "merged") for p in (tmp_path / "merged" / "feedback").rglob("*.html")) \
        == sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one" / "feedback").rglob("*.html"))
    assert [float(line.split(",")[2]) for line in one_csv.splitlines()[1:]] == [7, 2]
    with pytest.raises(ValueError, match="two shards"):  # the same shard merged twice
        shards.merge([tmp_path / "part1", tmp_path / "part1"], tmp_path / "bad", verbose=False)
