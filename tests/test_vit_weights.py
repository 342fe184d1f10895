"""The shipped Vision Transformer weights of chapter 15 reproduce, and meet the chapter's bars.

Every variant ships with every seed of ``tfbook.tasks.digits.SEEDS`` (float16 weights). The
recipe never sees the 450 test images: training uses the training split less a stratified
validation split (10% of each class), and the weights kept are those of the step with the
lowest validation cross-entropy.

Fast tests (a few seconds): every shipped model loads, its best step is the one its recorded
validation curve says; the main model (``cls-1d``) reaches 97% mean test accuracy over the
seeds and every seed at least 95%; the models without positions fall far short; the
augmentation is the identity at zero amplitude; bad names raise ``ValueError``.

``test_retraining_reproduces`` is SLOW (about 1 to 3 minutes on a shared 2-core CPU): it
retrains the main variant (``cls-1d``, seed 0) from scratch with the recipe in
``tfbook.tasks.digits`` and compares with what ships. Bitwise equality is not expected across
machines (BLAS kernels may sum in another order, and hundreds of steps amplify the difference),
so it compares outcomes: the first 20 losses within 1e-3 (before the runs can drift apart),
the test accuracy within 2 percentage points of the shipped model (96.0%) and at least 95%
(the three shipped seeds of cls-1d spread from 96.0% to 98.0%), and the best validation
cross-entropy within a factor of 2 (a broken recipe lands far outside these: 300 steps without
augmentation stop near 96% test accuracy with a validation loss twice as high).
"""

import numpy as np
import pytest
import torch

from tfbook.tasks import digits as dg
from tfbook.tasks._common import pick


@pytest.mark.parametrize("variant", sorted(dg.VARIANTS))
def test_shipped_weights_load_and_meet_the_bar(variant, one_thread):
    accs = []
    for seed in dg.SEEDS:
        model, history = dg.load_pretrained(variant, seed)
        losses = history.loss
        assert model.config == dg.config(variant) and history.extra["seed"] == seed
        assert history.extra["recipe"]["steps"] == dg.RECIPE["steps"]
        assert len(losses) == dg.RECIPE["steps"]  # the run went to the end; the best step was kept
        assert abs(losses[0] - np.log(10)) < 1e-5  # zero-initialised head: uniform prediction
        # the kept step is the one with the lowest validation loss of the recorded curve
        assert history.best_step == history.eval_step[int(np.argmin(history.eval))]
        accs.append(dg.evaluate(model.double(), "test"))  # float64: no CPU-dependent round-off
    accs = np.array(accs)
    if variant == "cls-1d":
        assert accs.mean() >= 0.97 and accs.min() >= 0.95, accs  # the chapter's bar, on its main model
    elif variant.endswith("none"):
        assert (0.5 < accs).all() and (accs < 0.9).all(), accs  # without positions it falls far short
    else:
        assert accs.min() >= 0.93, accs  # every model with positions lands in the mid-to-high 90s


def test_shipped_files_are_small():
    sizes = [dg.shipped(name).stat().st_size for name in dg.ARTIFACTS]
    assert len(sizes) == len(dg.VARIANTS) * len(dg.SEEDS) == 18
    assert sum(sizes) < 2_000_000, sum(sizes)  # float16 weights: about 50 KB a model


def test_validation_split_is_carved_from_training_images():
    train, val, test = dg.data()  # the default: 10% of each class of the training images
    full_train, none, full_test = dg.data(validation_fraction=0.0)
    assert none is None and torch.equal(test[0], full_test[0])
    assert len(train[1]) + len(val[1]) == len(full_train[1]) and abs(len(val[1]) - 135) <= 10
    assert torch.bincount(val[1], minlength=10).min() >= 12  # stratified: every class, about 10%
    assert dg.data()[1][1].tolist() == val[1].tolist()  # the same split every time (seeded)
    with pytest.raises(ValueError, match="no 'validation' split"):
        pick(dg.data(validation_fraction=0.0), "validation")


def test_learned_2d_positions_are_row_plus_column():
    """cls-2d-learned gives patch (r, c) (token r * 4 + c) the vector row[r] + col[c]: the same
    logits as a cls-1d model whose table holds exactly those sums (and zero for the class token)."""
    torch.manual_seed(0)
    m2 = dg.VisionTransformer(dg.config("cls-2d-learned")).double()
    with torch.no_grad():
        m2.W_C.normal_()  # a zero head would make every logit zero
        m2.pos_row.normal_()
        m2.pos_col.normal_()
    state = {k: v for k, v in m2.state_dict().items() if k not in ("pos_row", "pos_col")}
    r, c = torch.arange(16) // 4, torch.arange(16) % 4
    table = m2.pos_row.detach()[r] + m2.pos_col.detach()[c]  # (16, D)
    state["pos.weight"] = torch.cat([torch.zeros(1, table.shape[1], dtype=table.dtype), table])
    m1 = dg.VisionTransformer(dg.config("cls-1d")).double()
    m1.load_state_dict(state)
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(m2(x), m1(x), atol=1e-12, rtol=0)  # float64 round-off
        state["pos.weight"][1:] = m2.pos_row.detach()[c] + m2.pos_col.detach()[r]  # rows and columns swapped
        m1.load_state_dict(state)
        assert (m2(x) - m1(x)).abs().max() > 1e-3  # ... is told apart


def test_augment_is_identity_at_zero_amplitude():
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    same = dg.augment(x, g, max_angle=0.0, max_scale=0.0, max_shift=0.0)
    torch.testing.assert_close(same, x, atol=1e-6, rtol=0)  # float32 bilinear weights of exactly 1
    moved = dg.augment(x, g)
    assert moved.shape == x.shape and (moved - x).abs().max() > 1e-2


def test_bad_arguments():
    with pytest.raises(ValueError, match="variant must be one of"):
        dg.config("cls-3d")
    with pytest.raises(ValueError, match="seed must be one of"):
        dg.load_pretrained("cls-1d", seed=7)
    with pytest.raises(ValueError, match="images must be"):
        dg.augment(torch.zeros(8, 8), torch.Generator())
    with pytest.raises(ValueError, match="steps must be"):
        dg.train(steps=0)
    with pytest.raises(ValueError, match="validation_fraction"):
        dg.data(validation_fraction=1.0)


def test_retraining_reproduces():
    """SLOW: retrains the main model once (see the module docstring for the tolerances)."""
    shipped, shipped_history = dg.load_pretrained("cls-1d")
    model, history = dg.train("cls-1d", seed=0)
    np.testing.assert_allclose(history.loss[:20], shipped_history.loss[:20], atol=1e-3, rtol=0)
    # counts of correctly classified test images, integers: comparing the fractions k/450 with
    # 0.02 fails on float round-off at exactly 2 points (|0.98 - 0.96| = 0.020000000000000018)
    images, labels = pick(dg.data(), "test")
    n_test = len(labels)
    right_new, right_shipped = (round(dg.accuracy(m.double(), images, labels) * n_test) for m in (model, shipped))
    assert 100 * right_new >= 95 * n_test, (right_new, n_test)  # at least 95%
    assert 100 * abs(right_new - right_shipped) <= 2 * n_test, (right_new, right_shipped, n_test)  # within 2 points
    best_new, best_shipped = history.best_eval, shipped_history.best_eval
    assert best_shipped / 2 < best_new < 2 * best_shipped, (best_new, best_shipped)
