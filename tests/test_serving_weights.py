"""Chapter 20's artifacts (python -m tfbook.tasks.serving) against the code that made them and the
chapter's bars: serving_results.json (the recipe is the module's, slices of every measurement
recompute to float64 round-off, the claims hold on the shipped numbers), serving_windows.json
(StreamingLLM's W is the validation's choice and recomputes), serving_finetuned.pt and
serving_finetune.json (each method's learning rate and step are the validation's best, the float16
weights reproduce their curves, the PyTorch model with stretched rotary tables equals the NumPy
forward)."""

import numpy as np
import pytest
import torch

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
        se = sv.tokens_per_pass_standard_error(a, int(g), d["passes"])
        assert abs(d["tokens"] / d["passes"] - closed) <= 4 * se + 1e-12  # 4 standard errors (chapter 20)
        n = len(sv.RECIPE["prompts"]) * sv.RECIPE["spec_tokens"]
        assert n <= d["tokens"] <= n + len(sv.RECIPE["prompts"]) * int(g)  # every last round counted whole


def test_window_is_the_validations_choice():
    ws = sv.load_window_search()
    assert ws["recipe"] == {k: list(v) if isinstance(v, tuple) else v for k, v in sv.WINDOW_SEARCH.items()}
    assert ws["best"] == sv.RECIPE["window"] == int(min(ws["bits"], key=ws["bits"].get))
    params, cfg = sv.llama_params()
    w = sv.WINDOW_SEARCH
    ids = sv.prose.data().validation.numpy()[: w["chars"]].reshape(-1, w["length"])
    W = sv.RECIPE["window"]
    bits = sv.bits_per_position(sv.long_context_logits(ids, params, cfg, window=W, sinks=w["sinks"]), ids)
    assert abs(bits[:, cfg.block_size:].mean() - ws["bits"][str(W)]) < 1e-9  # float64 round-off


@pytest.fixture(scope="module")
def ft():
    return sv.load_finetune_results()


def test_finetune_recipe_and_choices(ft):
    assert ft["recipe"] == {k: list(v) if isinstance(v, tuple) else v for k, v in sv.FINETUNE.items()}
    for m in sv.FINETUNE["methods"]:
        search = ft["search"][m]
        assert set(search) == {str(lr) for lr in sv.FINETUNE["lrs"]}
        lr = min(search, key=lambda k: search[k]["best_eval"])
        assert float(lr) == ft["chosen"][m]["lr"] and search[lr]["best_step"] == ft["chosen"][m]["step"]
        assert search[lr]["best_eval"] == min(search[lr]["eval"])  # the step is the validation's best


@pytest.mark.parametrize("method", sv.FINETUNE["methods"])
def test_finetuned_weights_reproduce_their_curves(ft, method):
    _, cfg = sv.llama_params()
    model = sv.load_finetuned(method)
    live = sv.live_slices()["long"]
    kw = {} if method == "none" else dict(scaling=method, factor=sv.FINETUNE["factor"])
    bits = sv.bits_per_position(sv.long_context_logits(live, sv.finetuned_params(model), cfg, **kw), live)
    np.testing.assert_allclose(bits, np.array(ft["live"][f"ft_{method}_128"]), atol=1e-9, rtol=0)  # float64 round-off
    # the PyTorch model with its stretched tables == the NumPy forward (float64)
    ids = sv.prose.data().test.numpy()[:1024].reshape(2, 512)
    with torch.no_grad():
        t = model.double()(torch.as_tensor(ids)).numpy()
    np.testing.assert_allclose(t, sv.long_context_logits(ids, sv.finetuned_params(model), cfg, **kw), atol=1e-10, rtol=0)


def test_set_rope_scaling_changes_what_it_should():
    _, cfg = sv.llama_params()
    ids = sv.prose.data().test.numpy()[:512].reshape(1, 512)
    plain = sv._long_model()
    with torch.no_grad():
        a = plain.double()(torch.as_tensor(ids)).numpy()
        b = sv.set_rope_scaling(sv._long_model(), "pi", 4.0).double()(torch.as_tensor(ids)).numpy()
    np.testing.assert_allclose(a, sv.long_context_logits(ids, sv.llama_params()[0], cfg), atol=1e-10, rtol=0)
    assert np.abs(a - b).max() > 1  # PI's tables are really used
    with pytest.raises(ValueError, match="scaling must be"):
        sv.set_rope_scaling(plain, "linear")


def test_time_speculative_counts_plain_and_speculative_runs():
    """Chapter 20's CPU timing: T_d = 0 is plain decoding (one target pass per character); a draft equal
    to the target has every proposal accepted (T_d + 1 characters per pass); the times are positive."""
    from tfbook.tasks import prose

    small, _ = prose.load_pretrained("small")
    prompt = prose.data().test[:64].tolist()
    tm = sv.time_speculative(small, small, prompt, 8, (0, 2), seed=0, repeats=1)
    assert tm["runs"][0] == {**tm["runs"][0], "passes": 8, "drafted": 0, "emitted": 8}
    assert tm["runs"][2] == {**tm["runs"][2], "passes": 3, "drafted": 6, "emitted": 9}
    assert all(r["seconds"] > 0 for r in tm["runs"].values()) and tm["target_pass"] > 0 and tm["draft_pass"] > 0
    tm = sv.time_speculative(small, small, prompt, 4, (0,), seed=0, repeats=3)
    assert len(tm["runs"][0]["each"]) == 3 and tm["runs"][0]["seconds"] == min(tm["runs"][0]["each"])


def test_time_speculative_records_no_autograd_graph():
    """The runs (speculative_generate is no_grad) and the single passes that give c are timed in the same
    state, with no graph recorded, whatever the caller's autograd setting."""
    from tfbook.tasks import prose

    small, _ = prose.load_pretrained("small")
    prompt = prose.data().test[:64].tolist()
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.config = model, model.config

        def forward(self, x):
            seen.append(torch.is_grad_enabled())
            return self.model(x)

    with torch.enable_grad():
        sv.time_speculative(Spy(small), small, prompt, 2, (0,), seed=0, repeats=1)
    assert seen and not any(seen)
