"""The two small task modules of chapters 14 and 15: tfbook.tasks.ropebase (chapter 7's copy-3-back
task at several RoPE bases) and tfbook.tasks.cnnbracket (the CNN one rate above datasize's grid)."""

import copy

import numpy as np
import pytest
import torch

from tfbook.tasks import cnnbracket, datasize, digits, lengths, ropebase


def test_ropebase_shipped_weights_give_the_record():
    ids, record = lengths.test_ids(), ropebase.load_result()
    assert record["bases"] == list(ropebase.BASES) and record["offset"] == lengths.OFFSET
    for b in ropebase.BASES:
        for s in ropebase.SEEDS:
            a = lengths.accuracy_by_position(ropebase.load(b, s), ids)
            assert np.abs(a - np.array(record["accuracy"][f"{b:g}/{s}"])).max() < 1e-12, (b, s)


def test_ropebase_at_10000_is_chapter_7s_model_and_retrains_to_the_shipped_weights():
    torch.set_num_threads(1)
    trained = lengths.rounded(ropebase.train(10_000.0, 0))
    seven = lengths.rounded(lengths.train("rope", 0, offset=lengths.OFFSET))
    shipped = ropebase.load(10_000.0, 0)
    for k, v in shipped.state_dict().items():
        assert torch.equal(trained.state_dict()[k].to(torch.float16), v.to(torch.float16)), k
        assert torch.equal(seven.state_dict()[k], trained.state_dict()[k]), k
    ids = lengths.test_ids()[:16]
    with torch.no_grad():
        assert torch.equal(trained(ids), seven(ids))


def test_ropebase_bad_arguments():
    with pytest.raises(ValueError, match="base"):
        ropebase.load(50.0, 0)
    with pytest.raises(ValueError, match="seed"):
        ropebase.load(10.0, 7)
    with pytest.raises(ValueError, match="base"):
        ropebase.RopeBaseModel(1.0)


def test_cnnbracket_shipped_models_give_their_records():
    splits = datasize.data()
    (Xv, yv), (Xt, yt) = splits.validation, splits.test
    runs = cnnbracket.load_pretrained()
    assert [r["n"] for _, r in runs] == [150, 400, len(splits.train[1])]
    for net, rec in runs:
        assert rec["lr"] == cnnbracket.LR and rec["model"] == "cnn" and rec["seed"] == 0
        m64 = copy.deepcopy(net).double()
        assert round(digits.accuracy(m64, Xv, yv) * len(yv)) == rec["val_correct"]
        assert round(digits.accuracy(m64, Xt, yt) * len(yt)) == rec["test_correct"]
