"""The forwards-versus-backwards addition experiment (``tfbook.tasks.addition.train_orders``,
shipped as ``addition_orders.pt``) behind chapter 13's section on the digit order.

Fast except ``test_shipped_orders_reproduce_their_validation_scores`` (six small models on
1,000 validation problems: seconds). Tolerances: the stored validation curves were measured
on the float32 weights before they were rounded to float16; rounding may flip an answer
whose two likeliest digits were nearly tied, hence 5 problems in 1,000.
"""

import pytest
import torch

from tfbook.tasks import addition


def test_forward_split_holds_the_same_problems_with_the_sum_in_the_usual_order():
    back = addition.data(n_train=2_000, n_validation=100, n_test=200)
    fwd = addition.data(n_train=2_000, n_validation=100, n_test=200, reverse=False)
    tok = addition.tokenizer()
    for b_part, f_part in zip(back, fwd):
        assert b_part.shape == f_part.shape
        assert torch.equal(b_part[:, :addition.PROMPT_LEN], f_part[:, :addition.PROMPT_LEN])  # same prompts
        assert torch.equal(b_part[:, addition.PROMPT_LEN:].flip(1), f_part[:, addition.PROMPT_LEN:])
    for row in fwd.test[:50]:
        s = tok.decode(row)
        assert s[8:] == str(int(s[:3]) + int(s[4:7])).zfill(4), s


def test_default_recipe_is_the_backward_one():
    _, h_default = addition.train(steps=3)
    _, h_back = addition.train(steps=3, reverse=True)
    _, h_fwd = addition.train(steps=3, reverse=False)
    assert h_default.loss == h_back.loss and "reverse" not in h_default["recipe"]
    assert h_fwd["recipe"]["reverse"] is False and h_fwd.loss != h_back.loss


def test_train_orders_round_trip(tmp_path):
    result = addition.train_orders(steps=4, seeds=(0, 1), eval_every=2)
    assert result["eval_steps"] == [0, 2, 4] and result["seeds"] == [0, 1]
    assert set(result["models"]) == {"backward", "forward"}
    assert all(len(v) == 2 and len(v[0]) == 3 for v in result["validation"].values())
    loaded = addition.load_orders(addition.save_orders(result, tmp_path))
    ids = addition.data(n_train=10, n_validation=10, n_test=20).test
    for order in ("backward", "forward"):
        for m, m_loaded in zip(result["models"][order], loaded["models"][order]):
            for (k, v), (k2, v2) in zip(m.state_dict().items(), m_loaded.state_dict().items()):
                assert k == k2 and torch.equal(v.half().float(), v2)  # float16 on disk, exactly
        assert loaded["validation"][order] == result["validation"][order]
    with torch.no_grad():
        assert loaded["models"]["forward"][1](ids).shape == (20, 12, 12)
    with pytest.raises(ValueError, match="seeds"):
        addition.train_orders(steps=1, seeds=())


def test_shipped_orders_reproduce_their_validation_scores():
    shipped = addition.load_orders()
    assert shipped["seeds"] == list(addition.ORDER_SEEDS)
    assert shipped["recipe"] == addition.RECIPE
    assert shipped["eval_steps"][-1] == addition.RECIPE["steps"]
    for order, rev in (("backward", True), ("forward", False)):
        val = addition.data(reverse=rev).validation
        for model, curve in zip(shipped["models"][order], shipped["validation"][order]):
            got = addition.exact_match(model, val).double().mean().item()
            assert abs(got - curve[-1]) <= 0.005, (order, got, curve[-1])
