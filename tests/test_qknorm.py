"""QK-norm (chapter 14): RMSNorm of each head's queries and keys before the rotation.

The NumPy function, the PyTorch function and the module agree in float64; the module with
``qk_norm=True`` and copied weights equals Hugging Face's Qwen3 model (a peer with the same
placement: per-head RMSNorm with a ``D_K`` gain, then rotate-half RoPE), skipped where
transformers is absent; the cached decoding path equals the full forward; the score bound
``max|g_q| max|g_k| sqrt(D_K)`` holds whatever the weights; default off changes nothing; bad
gains raise the same ValueError in both twins; the task's logit probe equals a direct computation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tfbook.numpy as tnp
import tfbook.torch.functional as TF
from tfbook.torch.modern import GroupedQueryAttention, LlamaLM, LlamaLMConfig

ATOL = 1e-12  # float64 round-off on logits of size ~1


def _model(H_kv=2, qk_norm=True, seed=0, rope="half", tied=True):
    torch.manual_seed(seed)
    cfg = LlamaLMConfig(vocab_size=13, block_size=16, d_model=16, num_heads=4, num_kv_heads=H_kv, num_layers=2,
                        d_ff=24, rope=rope, tie_weights=tied, qk_norm=qk_norm)
    model = LlamaLM(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # away from the initial gains of 1, all of size ~1
            p.normal_(0.0, 0.3).add_(1.0 if p.dim() == 1 else 0.0)
    return model


def _ids(B=3, T=9, seed=1):
    return torch.randint(0, 13, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("H_kv,rope", [(4, "half"), (2, "interleaved"), (1, "half")])
def test_numpy_torch_and_module_agree(H_kv, rope):
    model = _model(H_kv, rope=rope)
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).numpy()
        ref_p = model(ids, return_attention=True)[0].numpy()
    c = model.config
    out_np = tnp.llama_lm(ids.numpy(), model.numpy_params(), 4, H_kv, rope=rope, eps=c.eps)
    t_params = {"W_E": model.W_E, "blocks": [{
        "norm_attn": b.norm_attn.params(), "attn": b.attn.params(), "norm_mlp": b.norm_mlp.params(),
        "mlp": b.mlp.params()} for b in model.blocks], "norm": model.norm.params(), "W_U": model.W_U}
    with torch.no_grad():
        out_t = TF.llama_lm(ids, t_params, 4, H_kv, rope=rope, eps=c.eps).numpy()
    assert np.abs(out_np - ref).max() < ATOL
    assert np.abs(out_t - ref).max() < ATOL
    assert np.abs(ref_p - ref).max() < ATOL
    # the gains matter: without them (plain attention on the same weights) the logits differ
    plain = model.numpy_params()
    for b in plain["blocks"]:
        b["attn"].pop("q_norm"), b["attn"].pop("k_norm")
    assert np.abs(tnp.llama_lm(ids.numpy(), plain, 4, H_kv, rope=rope) - ref).max() > 1e-3


def test_kv_cache_decoding_equals_the_full_forward():
    from tfbook.torch.modules import KVCache

    model = _model(2)
    ids = _ids(2, 10)
    with torch.no_grad():
        full = model(ids)
        caches = [KVCache() for _ in model.blocks]
        steps = [model.forward_cached(ids[:, :4], caches)] + [model.forward_cached(ids[:, t:t + 1], caches)
                                                               for t in range(4, 10)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < ATOL


def test_default_off_changes_nothing():
    torch.manual_seed(0)
    a = LlamaLM(LlamaLMConfig(vocab_size=13, d_model=16, num_heads=4))
    torch.manual_seed(0)
    b = LlamaLM(LlamaLMConfig(vocab_size=13, d_model=16, num_heads=4, qk_norm=False))
    assert list(a.state_dict()) == list(b.state_dict())
    assert not any("q_norm" in k or "k_norm" in k for k in a.state_dict())
    ids = _ids()
    assert torch.equal(a(ids), b(ids))


def test_score_bound_holds_whatever_the_weights():
    torch.manual_seed(3)
    attn = GroupedQueryAttention(16, 4, 2, qk_norm=True).double()
    with torch.no_grad():
        attn.W_Q.mul_(1e3), attn.W_K.mul_(1e3)  # huge projections: plain logits would be ~1e6
        attn.q_norm.gamma.uniform_(-2, 2), attn.k_norm.gamma.uniform_(-2, 2)
    X = torch.randn(2, 7, 16, dtype=torch.float64)
    Q, K = attn.qk(X)
    S = Q @ K.repeat_interleave(2, dim=-3).transpose(-1, -2) / math.sqrt(4)
    bound = attn.q_norm.gamma.abs().max() * attn.k_norm.gamma.abs().max() * math.sqrt(4)
    assert S.abs().max() <= bound * (1 + 1e-12)
    attn.qk_norm = False  # the same weights without QK-norm
    Q, K = attn.qk(X)
    assert (Q @ K.repeat_interleave(2, dim=-3).transpose(-1, -2)).abs().max() / 2 > 1e3 * bound


@pytest.mark.parametrize("params_edit,match", [
    (lambda p, D_K: p.pop("k_norm"), "both 'q_norm' and 'k_norm'"),
    (lambda p, D_K: p.__setitem__("q_norm", np.ones(D_K + 1)), r"params\['q_norm'\]"),
])
def test_bad_gains_raise_in_both_twins(params_edit, match):
    rng = np.random.default_rng(0)
    D, H, H_kv = 16, 4, 2
    D_K = D // H
    p = {"W_Q": rng.normal(size=(D, D)), "W_K": rng.normal(size=(D, H_kv * D_K)),
         "W_V": rng.normal(size=(D, H_kv * D_K)), "W_O": rng.normal(size=(D, D)),
         "q_norm": np.ones(D_K), "k_norm": np.ones(D_K)}
    params_edit(p, D_K)
    X = rng.normal(size=(2, 5, D))
    with pytest.raises(ValueError, match=match):
        tnp.grouped_query_attention(X, X, p, H, H_kv)
    with pytest.raises(ValueError, match=match):
        TF.grouped_query_attention(torch.as_tensor(X), torch.as_tensor(X), {k: torch.as_tensor(v) for k, v in p.items()},
                                   H, H_kv)


def test_function_matches_the_module_attention_with_cache_free_positions():
    torch.manual_seed(5)
    attn = GroupedQueryAttention(16, 4, 2, qk_norm=True).double()
    with torch.no_grad():
        attn.q_norm.gamma.normal_(1, 0.3), attn.k_norm.gamma.normal_(1, 0.3)
    X = torch.randn(2, 6, 16, dtype=torch.float64)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    Z, P = attn(X, mask=mask, return_attention=True)
    Z_np, P_np = tnp.grouped_query_attention(X.numpy(), X.numpy(), attn.numpy_params(), 4, 2, mask=mask.numpy(),
                                             rope="half")
    assert np.abs(Z_np - Z.detach().numpy()).max() < ATOL
    assert np.abs(P_np - P.detach().numpy()).max() < ATOL


def test_equals_hugging_face_qwen3_with_copied_weights():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (peer check only)")
    if not hasattr(transformers, "Qwen3Config"):
        pytest.skip("this transformers has no Qwen3")
    model = _model(2, rope="half", tied=True)
    c = model.config
    cfg = transformers.Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
                                   num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                                   num_key_value_heads=c.num_kv_heads, head_dim=c.d_model // c.num_heads,
                                   max_position_embeddings=64, rms_norm_eps=c.eps, rope_theta=c.rope_base,
                                   tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                                   attn_implementation="eager")
    torch.manual_seed(0)
    peer = transformers.Qwen3ForCausalLM(cfg).double().eval()
    sd = {"model.embed_tokens.weight": model.W_E, "model.norm.weight": model.norm.gamma}
    for i, b in enumerate(model.blocks):
        pre = f"model.layers.{i}."
        sd.update({pre + "input_layernorm.weight": b.norm_attn.gamma,
                   pre + "post_attention_layernorm.weight": b.norm_mlp.gamma,
                   pre + "self_attn.q_proj.weight": b.attn.W_Q.T, pre + "self_attn.k_proj.weight": b.attn.W_K.T,
                   pre + "self_attn.v_proj.weight": b.attn.W_V.T, pre + "self_attn.o_proj.weight": b.attn.W_O.T,
                   pre + "self_attn.q_norm.weight": b.attn.q_norm.gamma,
                   pre + "self_attn.k_norm.weight": b.attn.k_norm.gamma})
        mlp = b.mlp.params()
        sd.update({pre + "mlp.gate_proj.weight": mlp["W_gate"].T, pre + "mlp.up_proj.weight": mlp["W_up"].T,
                   pre + "mlp.down_proj.weight": mlp["W_down"].T})
    sd["lm_head.weight"] = model.W_E
    missing, unexpected = peer.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    ids = _ids()
    with torch.no_grad():
        ours, theirs = model(ids), peer(ids).logits
    # Hugging Face's rotary embedding computes its angles in float32 (it casts to .float()), so the
    # agreement is float32 round-off of angles up to 8 radians: about 1e-6 on logits of size ~1
    assert (ours - theirs).abs().max() < 1e-5
    # and the peer differs from our model without QK-norm on the same weights
    plain = model.numpy_params()
    for b in plain["blocks"]:
        b["attn"].pop("q_norm"), b["attn"].pop("k_norm")
    assert np.abs(tnp.llama_lm(ids.numpy(), plain, 4, 2) - theirs.numpy()).max() > 1e-3


# ----------------------------------------------------------------------------- the shipped experiment
def test_qknorm_artifacts_exist_are_small_and_complete():
    from tfbook.tasks import qknorm
    from tfbook.tasks._common import shipped

    for name in qknorm.ARTIFACTS:
        assert shipped(name).is_file() and shipped(name).stat().st_size < 200_000, name
    curves = qknorm.load_curves()
    keys = sorted((r["lr"], r["arm"], r["seed"]) for r in curves["runs"])
    assert keys == sorted((lr, arm, s) for lr in qknorm.LRS for arm in qknorm.ARMS for s in qknorm.RECIPE["seeds"])
    for r in curves["runs"]:
        assert len(r["probe_steps"]) == len(r["max_logit"]) == qknorm.RECIPE["steps"] // qknorm.RECIPE["probe_every"] + 1


def test_shipped_qknorm_models_reproduce_their_recorded_figures():
    from tfbook.tasks import qknorm

    probe = qknorm.probe_ids()
    for arm in qknorm.ARMS:
        model, history = qknorm.load_pretrained(arm)
        assert model.config.qk_norm == (arm == "on")
        rec = history.extra["rounded"]
        model = model.double()
        assert abs(qknorm.max_logit(model, probe) - rec["max_logit"]) < 1e-9
        assert abs(qknorm.evaluate(model) - rec["final_validation"]) < 1e-9


def test_the_recipe_reproduces_a_shipped_logit_curve(one_thread):
    from tfbook.tasks import qknorm

    curves = qknorm.load_curves()
    rec = next(r for r in curves["runs"] if (r["arm"], r["lr"], r["seed"]) == ("on", 0.1, 1))
    _, history = qknorm.train("on", lr=0.1, seed=1)
    got = np.array(history.extra["max_logit"])
    assert got[0] == pytest.approx(rec["max_logit"][0], rel=1e-6)  # the initial weights: seeded
    # On the machine that wrote the record the run is bit for bit the same. Under the nbval second
    # profile's generic kernels (ATEN_CPU_CAPABILITY=default, one thread) it is not: at rate 0.1 the
    # float32 rounding grows over 200 steps to 24% at one probe, 4% on the peak logit and 0.029 bits
    # on the final score (the old bars, 5% pointwise and 0.02 bits, failed there). So the bars are on
    # what the record carries, each with room over that drift:
    off = [r for r in curves["runs"] if (r["arm"], r["lr"]) == ("off", 0.1)]
    assert got.max() == pytest.approx(max(rec["max_logit"]), rel=0.15)       # the peak (4% apart under B)
    assert got.max() < 0.1 * min(max(r["max_logit"]) for r in off)           # far below every plain seed's
    final = history.extra["final_validation"]
    assert abs(final - rec["final_validation"]) < 0.1                         # seeds at this rate span 0.12
    assert final < min(r["final_validation"] for r in off)                    # below every plain seed


def test_modern_bracket_record_puts_the_best_rate_inside_the_grid():
    from tfbook.tasks import modern

    scores = modern.load_scores()
    grid = scores["lrs"] + scores["bracket_lrs"]
    assert scores["bracket_lrs"] == list(modern.BRACKET_LRS)
    for kind in modern.KINDS:
        row = {**scores["lr_search"][kind], **scores["lr_bracket"][kind]}
        best = min((lr for lr in grid if str(lr) in row), key=lambda lr: row[str(lr)])
        assert min(grid) < best < max(grid), kind
