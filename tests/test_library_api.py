"""Issue 25 item 7, the library as a newcomer uses it: config fields documented, the
"warmup_cosine" defaults stated and true, one training loop with two documented entry points,
a device argument where training happens, and a clear message when the [course] extra is missing."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tfbook.torch import models, modern, training
from tfbook.torch.models import DecoderLM, DecoderLMConfig, EncoderDecoderConfig, ViTConfig, lm_batch, lm_loss, train_steps
from tfbook.torch.modern import LlamaLMConfig
from tfbook.torch.training import WARMUP_COSINE_DEFAULTS, History, lr_schedule, train

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [DecoderLMConfig, EncoderDecoderConfig, ViTConfig, LlamaLMConfig]


def _doc_fields(cls) -> dict[str, str]:
    """numpydoc ``name : type[, default X]`` lines of the Attributes section -> the line."""
    doc = inspect.getdoc(cls) or ""
    assert "Attributes\n----------" in doc, f"{cls.__name__} has no Attributes section"
    section = doc.split("Attributes\n----------", 1)[1]
    return {m.group(1): m.group(0) for m in re.finditer(r"^(\w+) : .*$", section, flags=re.M)}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_field_is_documented_with_its_default(cls):
    documented = _doc_fields(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(documented) == set(fields), (f"{cls.__name__}: undocumented {sorted(set(fields) - set(documented))}, "
                                            f"documented but no field {sorted(set(documented) - set(fields))}")
    for name, f in fields.items():
        line = documented[name]
        if f.default is dataclasses.MISSING:
            assert "default" not in line, f"{cls.__name__}.{name} is required but documented with a default: {line}"
            continue
        m = re.search(r"default (.+)$", line)
        assert m, f"{cls.__name__}.{name}: the documented line gives no default: {line!r}"
        stated = m.group(1).strip()
        value = stated.strip('"') if stated.startswith('"') else eval(stated)  # a literal: 64, 1e-5, True
        assert value == f.default and type(value) is type(f.default), \
            f"{cls.__name__}.{name}: documented default {stated}, actual {f.default!r}"


def test_warmup_cosine_defaults_are_what_the_docstring_says():
    assert WARMUP_COSINE_DEFAULTS == (0, 0.0)
    doc = inspect.getdoc(lr_schedule)
    assert "no warm-up" in doc and "last step at learning rate 0" in doc
    lr, steps = 0.01, 11
    bare = lr_schedule("warmup_cosine", lr, steps)
    assert bare == lr_schedule(("warmup_cosine", *WARMUP_COSINE_DEFAULTS), lr, steps)
    assert bare[0] == lr  # no warm-up: the first step uses the peak
    assert bare[-1] == 0.0  # the last step at lr 0
    # closed form of the half cosine from step 0 to step steps - 1
    import math
    for s, r in enumerate(bare):
        assert r == pytest.approx(0.5 * lr * (1 + math.cos(math.pi * s / (steps - 1))), rel=1e-12, abs=1e-15)
    explicit = lr_schedule(("warmup_cosine", 3, lr / 10), lr, steps)
    assert explicit[0] == pytest.approx(lr / 3) and explicit[2] == lr and explicit[-1] == pytest.approx(lr / 10)


def test_train_and_train_steps_point_to_each_other_and_keep_their_types():
    assert "train_steps" in inspect.getdoc(train)
    assert "training.train" in inspect.getdoc(train_steps)
    assert "train_steps" in (training.__doc__ or "")
    assert inspect.signature(train).return_annotation in (History, "History")
    assert inspect.signature(train_steps).return_annotation in (list[float], "list[float]")
    for fn in (train, train_steps):
        p = inspect.signature(fn).parameters["device"]
        assert p.default is None, fn.__name__
        assert "device" in inspect.getdoc(fn)


def _toy(seed=0):
    torch.manual_seed(seed)
    cfg = DecoderLMConfig(vocab_size=7, block_size=8, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    data = torch.arange(200) % 7
    return DecoderLM(cfg), (lambda g: lm_batch(data, 8, 4, generator=g)), lm_loss


def test_train_steps_is_train_loss():
    m1, batch_fn, loss_fn = _toy()
    m2, _, _ = _toy()
    a = train_steps(m1, loss_fn, batch_fn, 5, lr=1e-2, seed=3, disable=True)
    b = train(m2, loss_fn, batch_fn, 5, lr=1e-2, seed=3, disable=True)
    assert isinstance(a, list) and isinstance(b, History)
    assert a == b.loss
    m3, _, _ = _toy()
    c = train_steps(m3, loss_fn, batch_fn, 5, lr=1e-2, seed=4, disable=True)
    assert c != a  # the seed reaches the batches


def test_device_argument_moves_model_and_batches():
    m_none, batch_fn, loss_fn = _toy()
    m_cpu, _, _ = _toy()
    seen = []

    def loss_seen(model, x, y):
        seen.append((x.device.type, next(model.parameters()).device.type))
        return loss_fn(model, x, y)

    a = train(m_none, loss_fn, batch_fn, 3, seed=1, disable=True)
    b = train(m_cpu, loss_seen, batch_fn, 3, seed=1, disable=True, device="cpu")
    assert a.loss == b.loss and seen == [("cpu", "cpu")] * 3
    # PyTorch's "meta" device exists on every machine and is not the CPU: with it as the
    # training device, the model and the batch must both arrive there (the loss then has no
    # value, so the step fails after loss_fn has recorded what it saw)
    seen.clear()
    m_meta, _, _ = _toy()
    real = training._check_device
    try:
        training._check_device = lambda d: torch.device("meta") if d == "meta" else real(d)
        with pytest.raises(Exception):
            train(m_meta, loss_seen, batch_fn, 1, disable=True, device="meta")
    finally:
        training._check_device = real
    assert seen == [("meta", "meta")]
    assert next(m_meta.parameters()).device.type == "meta"


def test_device_auto_follows_tfbook_device(monkeypatch):
    monkeypatch.setenv("TFBOOK_DEVICE", "cpu")
    assert training._check_device("auto") == torch.device("cpu")
    assert training._check_device(None) is None
    monkeypatch.setenv("TFBOOK_DEVICE", "tpu")
    with pytest.raises(ValueError, match="TFBOOK_DEVICE"):
        training._check_device("auto")


def test_bad_device_is_a_clear_value_error():
    m, batch_fn, loss_fn = _toy()
    with pytest.raises(ValueError, match=r"device='gpu'"):
        train(m, loss_fn, batch_fn, 1, disable=True, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device='cuda' is not available here"):
            train(m, loss_fn, batch_fn, 1, disable=True, device="cuda")


BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Block())
import importlib.util
_orig = importlib.util.find_spec
importlib.util.find_spec = lambda n, p=None: None if n.split('.')[0] in {blocked!r} else _orig(n, p)
try:
    import tfbook.course
    import tfbook.course.release
    tfbook.course.release.require_course_extra("release")  # import needs only the [check] extra's modules
except ImportError as e:
    print('IMPORTERROR', type(e).__name__, e)
else:
    print('IMPORTED')
"""


@pytest.mark.parametrize("blocked", [(), ("nbformat",), ("nbgrader",)])
def test_course_without_its_extra_names_the_extra(blocked):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", BLOCK.format(blocked=set(blocked) or set())],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    if not blocked:
        assert out.stdout.strip() == "IMPORTED"
    else:
        line = out.stdout.strip()
        assert line.startswith("IMPORTERROR ImportError"), line
        assert "[course]" in line and 'pip install "tfbook[course]"' in line and blocked[0] in line, line
