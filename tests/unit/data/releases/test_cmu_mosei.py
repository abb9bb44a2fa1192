"""The `cmu-mosei` converter (raymm.data.releases.cmu_mosei) on tiny pickles of the aligned
features: pooling, labels, video groups; no valid split, bad layouts."""

import pickle

import numpy as np
import pytest

from raymm.data.prepare import prepare
from raymm.errors import DataError, RaymmError

from tiny_releases import mosei_pickle as _mosei_pickle
from tiny_releases import no_partial, npz


def test_cmu_mosei_pooling_labels_and_video_groups(tmp_path):
    src = _mosei_pickle(tmp_path / "mosei_senti_data.pkl")
    res = prepare("cmu-mosei", src, tmp_path / "m2.npz")
    z = npz(res.path)
    assert z["sensors"].tolist() == ["text", "visual", "acoustic"]
    assert z["splits"].tolist() == ["train", "valid", "test"]
    assert res.shapes == {"text": (768,), "visual": (35,), "acoustic": (74,)}
    assert res.sizes == {"train": 4, "valid": 2, "test": 3}
    np.testing.assert_allclose(z["train_text"], 2.0)      # mean of 1 and 3; padding ignored
    np.testing.assert_allclose(z["test_visual"], 0.5)
    assert z["train_acoustic"][0, 0] == pytest.approx(0.5)  # (1 + 0 from -inf) / 2
    np.testing.assert_allclose(z["train_acoustic"][:, 1:], 1.0)
    assert z["class_names"].tolist() == ["negative", "positive"]
    assert z["train_y"].tolist() == [0, 1, 1, 1] and z["test_y"].tolist() == [0, 0, 1]
    # groups = source videos a..f in sorted order; segments of one video share a group
    assert z["train_group"].tolist() == [0, 0, 1, 2] and z["valid_group"].tolist() == [1, 5]
    assert z["test_group"].tolist() == [3, 3, 4]
    z7 = npz(prepare("cmu-mosei", tmp_path, tmp_path / "m7.npz", classes=7).path)
    assert z7["train_y"].tolist() == [2, 3, 3, 6]    # round(-1.2)=-1, 0, round(0.4)=0, 3
    assert z7["test_y"].tolist() == [3, 0, 5]        # round(-0.5)=0 (half to even), clip -3.7
    assert z7["class_names"].tolist() == ["-3", "-2", "-1", "0", "1", "2", "3"]
    z3 = npz(prepare("cmu-mosei", src, tmp_path / "m3.npz", classes=3).path)
    assert z3["class_names"].tolist() == ["negative", "neutral", "positive"]
    assert z3["train_y"].tolist() == [0, 1, 1, 2]    # -1.2 -> -1, 0, 0.4 -> 0, 2.6 -> +1
    assert z3["test_y"].tolist() == [1, 0, 2]        # -0.5 -> 0 (half to even), -3.7, 1.5 -> 2
    zt = npz(prepare("cmu-mosei", src, tmp_path / "mt.npz", keep_time=True).path)
    assert zt["train_text"].shape == (4, 3, 768) and zt["test_acoustic"][0, 2, 0] == 0.0


def test_cmu_mosei_without_valid_and_bad_layouts(tmp_path):
    src = _mosei_pickle(tmp_path / "m.pkl", with_valid=False)
    assert prepare("cmu-mosei", src, tmp_path / "a.npz").sizes == {"train": 4, "test": 3}
    data = pickle.loads(src.read_bytes())
    del data["test"]["vision"]
    src.write_bytes(pickle.dumps(data))
    with pytest.raises(DataError, match=r"\[test\]: no 'vision' / 'visual' / 'facet' key"):
        prepare("cmu-mosei", src, tmp_path / "b.npz")
    data = pickle.loads(_mosei_pickle(src).read_bytes())
    data["train"]["labels"] = data["train"]["labels"][:3]
    src.write_bytes(pickle.dumps(data))
    with pytest.raises(DataError, match=r"\[train\]: sample counts differ"):
        prepare("cmu-mosei", src, tmp_path / "b.npz")
    src.write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="unreadable pickle"):
        prepare("cmu-mosei", src, tmp_path / "b.npz")
    with pytest.raises(RaymmError, match="--classes must be 2, 3 or 7"):
        prepare("cmu-mosei", src, tmp_path / "b.npz", classes=4)
    assert not (tmp_path / "b.npz").exists() and no_partial(tmp_path)
