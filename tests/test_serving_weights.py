"""serving_results.json (python -m tfbook.tasks.serving) against the code that made it and the
chapter's bars: the recipe is the module's, slices of every measurement recompute to float64
round-off, and the claims chapter 20 makes hold on the shipped numbers."""

import numpy as np
import pytest

from tfbook.tasks import serving as sv


@pytest.fixture(scope="module")
def res():
    return sv.load_pretrained()


def test_recipe_is_the_modules(res):
    assert res["recipe"] == {k: list(v) if isinstance(v, tuple) else v for k, v in sv.RECIPE.items()}
    assert set(res["long"]) == {"64"} | {str(L) for L in sv.RECIPE["lengths"]}
    assert set(res["speculative"]) == {str(g) for g in sv.RECIPE["gammas"]}


def test_live_slices_recompute(res):
    params, cfg = sv.llama_params()
    live = sv.live_slices()
    bits = sv.bits_per_position(sv.long_context_logits(live["long"], params, cfg, **sv.method_kwargs("yarn", 2)),
                                live["long"])
    np.testing.assert_allclose(bits, np.array(res["live"]["long_yarn_128"]), atol=1e-9, rtol=0)  # float64 round-off
    p4, _ = sv.quantized_params(params, 4)
    q = sv.bits_per_position(sv.long_context_logits(live["quant"], p4, cfg), live["quant"])
    np.testing.assert_allclose(q, np.array(res["live"]["quant_int4"]), atol=1e-9, rtol=0)  # float64 round-off


def test_the_chapters_claims_hold(res):
    base = np.mean(res["long"]["64"]["none"][32:])
    for L in sv.RECIPE["lengths"]:
        d = {m: np.mean(v[64:]) for m, v in res["long"][str(L)].items()}
        assert d["yarn"] + 0.2 < d["ntk"] < d["none"] - 0.2
        assert abs(d["window"] - base) < 0.1 and abs(d["sinks"] - base) < 0.1
    Q = res["quant"]
    assert abs(Q["int8"]["bpc"] - Q["float"]["bpc"]) < 0.002 and 0.01 < Q["int4"]["bpc"] - Q["float"]["bpc"] < 0.1
    assert Q["float"]["weight_bytes"] > 3.5 * Q["int8"]["weight_bytes"] and Q["int8"]["weight_bytes"] > 1.5 * Q["int4"]["weight_bytes"]
    for g, d in res["speculative"].items():
        a = d["accepted"] / d["tried"]
        closed = float(sv.expected_tokens_per_pass(a, int(g)))
        assert abs(d["tokens"] / d["passes"] - closed) < 0.05 * closed
        assert d["tokens"] == len(sv.RECIPE["prompts"]) * sv.RECIPE["spec_tokens"]
