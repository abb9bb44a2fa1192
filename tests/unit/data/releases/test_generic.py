"""The papers' datasets from `raymm data prepare` files: `crema_d`, `ave`, `cmu_mosei`.

Each test converts a tiny release in its official layout (tests/tiny_releases.py), loads the
file with the dataset's loader and checks sensors, shapes, splits, classes, groups and the
standardisation by hand; then FedMChain runs on each file end to end.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

import raymm
from raymm.app.build import load_scenario
from raymm.app.cli import main
from raymm.config.schema import ModelSpec, PopulationSpec
from raymm.data import load_dataset
from raymm.data.prepare import prepare
from raymm.data.releases import CONVERTERS
from raymm.data.releases.crema_d import CREMA_EMOTIONS
from raymm.errors import DataError, ScenarioError
from raymm.models import MultimodalNet
from raymm.population.devices import build_population

from tiny_releases import AV, ave, crema, mosei_pickle, mosei_random_pickle, npz


def _crema_file(tmp_path: Path, **options) -> Path:
    crema(tmp_path / "CREMA-D")
    return prepare("crema-d", tmp_path / "CREMA-D", tmp_path / "crema_d.npz",
                   test_fraction=0.4, **AV, **options).path


def test_default_files_are_the_converters_outputs():
    from raymm.data import DATASETS

    for name, conv in (("crema_d", "crema-d"), ("ave", "ave"), ("cmu_mosei", "cmu-mosei")):
        loader = DATASETS[name]
        assert loader.Params().path == CONVERTERS[conv].default_file


def test_crema_d_sensors_shapes_classes_and_actor_groups(tmp_path):
    path = _crema_file(tmp_path)
    z = npz(path)
    raw = load_dataset("crema_d", {"path": str(path), "standardize": False}, 0)
    assert raw.name == "crema_d" and raw.sensors == ("audio", "visual")
    assert raw.class_names == CREMA_EMOTIONS and raw.num_classes == 6
    assert (len(raw.train), len(raw.test)) == (6, 4)
    # spectrograms come as [frames, n_mels]: time first, mel bands as channels
    assert raw.sensor_shape("audio") == (101, 16) and raw.sensor_shape("visual") == (8, 8)
    assert np.array_equal(raw.train.x["audio"], z["train_audio"].transpose(0, 2, 1))
    assert np.array_equal(raw.test.x["visual"], z["test_visual"])
    assert np.array_equal(raw.train.y, z["train_y"]) and np.array_equal(raw.test.y, z["test_y"])
    test_actors = sorted(range(1001, 1006), key=lambda g: zlib.crc32(str(g).encode()))[:2]
    assert sorted(set(raw.test.group.tolist())) == sorted(test_actors)
    assert sorted(set(raw.train.group.tolist())) == sorted(set(range(1001, 1006)) -
                                                           set(test_actors))
    # standardised with the training split's statistics: per mel band, one value for frames
    ds = load_dataset("crema_d", {"path": str(path)}, 0)
    a = raw.train.x["audio"].astype(np.float64)
    mean, std = a.mean(axis=(0, 1)), a.std(axis=(0, 1))
    np.testing.assert_allclose(ds.train.x["audio"].mean(axis=(0, 1)), 0, atol=1e-4)
    np.testing.assert_allclose(ds.test.x["audio"], (raw.test.x["audio"] - mean) / std,
                               rtol=1e-4, atol=1e-4)
    v = raw.train.x["visual"].astype(np.float64)
    np.testing.assert_allclose(ds.test.x["visual"],
                               (raw.test.x["visual"] - v.mean()) / v.std(), rtol=1e-4, atol=1e-4)
    assert ds.meta["standardization"]["audio"]["mean"] == pytest.approx(mean.tolist())
    assert ds.meta["file_sensors"] == {"audio": "audio", "visual": "visual"}


def test_by_group_puts_one_actor_on_each_device(tmp_path):
    ds = load_dataset("crema_d", {"path": str(_crema_file(tmp_path))}, 0)
    spec = PopulationSpec(devices=3, partition={"kind": "by_group"})
    pop = build_population(spec, ds, seed=0)
    held = [sorted(set(ds.train.group[pop.indices(d)].tolist())) for d in range(pop.n)]
    assert sorted(held) == [[g] for g in sorted(set(ds.train.group.tolist()))]
    assert pop.num_samples.tolist() == [2, 2, 2]


def test_rgb_frames_are_standardised_per_colour_channel(tmp_path):
    ds = load_dataset("crema_d", {"path": str(_crema_file(tmp_path, rgb=True))}, 0)
    assert ds.sensor_shape("visual") == (3, 8, 8)
    np.testing.assert_allclose(ds.train.x["visual"].mean(axis=(0, 2, 3)), 0, atol=1e-4)
    assert len(ds.meta["standardization"]["visual"]["mean"]) == 3


def test_ave_valid_joins_the_training_pool_and_test_stays_pooled(tmp_path):
    ave(tmp_path, split_files=True)
    path = prepare("ave", tmp_path, tmp_path / "ave.npz", seconds=1.0, n_mels=8,
                   image_size=4).path
    ds = load_dataset("ave", {"path": str(path)}, 0)
    assert ds.sensors == ("audio", "visual") and ds.num_classes == 3
    assert ds.class_names == ("Church bell", "Dog", "Male speech, man speaking")
    assert (len(ds.train), len(ds.test)) == (4, 2) and ds.meta["train_pool"] == ["train", "valid"]
    assert ds.sensor_shape("audio") == (101, 8) and ds.sensor_shape("visual") == (4, 4)
    z = npz(path)
    assert ds.train.group.tolist() == z["train_group"].tolist() + z["valid_group"].tolist()
    only = load_dataset("ave", {"path": str(path), "train_pool": "train"}, 0)
    every = load_dataset("ave", {"path": str(path), "train_pool": "all"}, 0)
    assert len(only.train) == 3 and len(every.train) == 6 and len(every.test) == 2
    assert sorted(every.train.group.tolist()) == list(range(6))


def test_cmu_mosei_acoustic_is_the_audio_sensor(tmp_path):
    path = prepare("cmu-mosei", mosei_pickle(tmp_path / "m.pkl"), tmp_path / "m.npz").path
    z = npz(path)
    ds = load_dataset("cmu_mosei", {"path": str(path), "standardize": False}, 0)
    assert ds.sensors == ("text", "audio", "visual")
    assert ds.meta["file_sensors"] == {"text": "text", "audio": "acoustic", "visual": "visual"}
    assert {m: ds.sensor_shape(m) for m in ds.sensors} == {"text": (768,), "audio": (74,),
                                                           "visual": (35,)}
    assert np.array_equal(ds.train.x["audio"][:4], z["train_acoustic"])
    assert np.array_equal(ds.test.x["audio"], z["test_acoustic"])
    assert ds.class_names == ("negative", "positive")
    assert ds.train.y.tolist() == [0, 1, 1, 1, 1, 0]                  # train then valid
    assert ds.train.group.tolist() == [0, 0, 1, 2, 1, 5] and ds.test.group.tolist() == [3, 3, 4]
    assert load_dataset("cmu_mosei", {"path": str(path), "classes": 2}, 0).num_classes == 2
    with pytest.raises(DataError, match=r"holds 2 classes \(negative, positive\); "
                                        r"dataset.classes asks for 3"):
        load_dataset("cmu_mosei", {"path": str(path), "classes": 3}, 0)


def test_cmu_mosei_features_standardised_and_padding_kept_zero(tmp_path):
    src = mosei_random_pickle(tmp_path / "r.pkl")
    pooled = prepare("cmu-mosei", src, tmp_path / "p.npz").path
    ds = load_dataset("cmu_mosei", {"path": str(pooled)}, 0)
    for m in ds.sensors:
        np.testing.assert_allclose(ds.train.x[m].mean(axis=0), 0, atol=1e-4)
        np.testing.assert_allclose(ds.train.x[m].std(axis=0), 1, atol=1e-3)
    timed = prepare("cmu-mosei", src, tmp_path / "t.npz", keep_time=True).path
    raw = load_dataset("cmu_mosei", {"path": str(timed), "standardize": False}, 0)
    ds = load_dataset("cmu_mosei", {"path": str(timed)}, 0)
    assert ds.sensor_shape("text") == (4, 768) and ds.sensor_shape("audio") == (4, 74)
    assert not ds.train.x["text"][:, -1].any() and not ds.test.x["visual"][:, -1].any()
    steps = raw.train.x["audio"][:, :-1].reshape(-1, 74).astype(np.float64)  # non-padding
    np.testing.assert_allclose(ds.test.x["audio"][:, :-1],
                               (raw.test.x["audio"][:, :-1] - steps.mean(0)) / steps.std(0),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, kind, auto", [
    ((301, 40), "cnn1d", "cnn2d"),     # CREMA-D log-mel as the loader exposes it: [T, n_mels]
    ((501, 40), "cnn2d", "cnn2d"),     # AVE, 5-s events
    ((64, 64), "cnn2d", "cnn2d"),      # grey frames
    ((3, 64, 64), "cnn2d", "cnn2d"),   # --rgb frames: three input channels
    ((768,), "mlp", "mlp"),            # MOSEI pooled features
    ((50, 768), "cnn1d", "cnn2d"),     # MOSEI --keep-time: set cnn1d to convolve over time
])
def test_encoders_take_the_release_shapes(shape, kind, auto):
    import torch

    from raymm.models.encoders import auto_kind

    assert auto_kind(shape) == auto
    for spec in (ModelSpec(encoders={"x": kind}, embed_dim=8), ModelSpec(embed_dim=8)):
        net = MultimodalNet(("x",), {"x": shape}, 3, spec)
        out = net({"x": torch.randn(2, *shape)}, torch.ones(2, 1))
        assert out.logits.shape == (2, 3)
    if shape == (3, 64, 64):
        assert net.encoders["x"][1].in_channels == 3


# --------------------------------------------------------------------------- bad inputs

def _har_file(path: Path) -> Path:
    arrays = {f"{sp}_{k}": np.zeros((2, 128, 3), np.float32) for sp in ("train", "test")
              for k in ("acc", "gyro")}
    arrays |= {f"{sp}_{k}": np.arange(2) for sp in ("train", "test") for k in ("y", "subject")}
    np.savez(path, **arrays)
    return path


def test_wrong_files_give_one_clear_message(tmp_path):
    crema_file = _crema_file(tmp_path)
    cases = [
        ("crema_d", tmp_path / "nope.npz", r"dataset crema_d: file not found: .*nope\.npz"),
        ("crema_d", _har_file(tmp_path / "har.npz"),
         r"har\.npz: not a file of `raymm data prepare crema-d`.*har layout"),
        ("ave", crema_file, r"written by `raymm data prepare crema-d`.*name: crema_d"),
        ("cmu_mosei", crema_file, r"written by `raymm data prepare crema-d`"),
        ("crema_d", tmp_path / "CREMA-D", r"is a folder; .*raymm data prepare crema-d --from"),
    ]
    (tmp_path / "junk.npz").write_bytes(b"not an archive at all")
    cases.append(("crema_d", tmp_path / "junk.npz", r"junk\.npz: unreadable or corrupt"))
    np.save(tmp_path / "one.npy", np.zeros(3))
    cases.append(("crema_d", tmp_path / "one.npy", r"one\.npy: not an \.npz archive"))
    arrays = npz(crema_file)
    del arrays["meta_json"], arrays["test_group"]
    np.savez(tmp_path / "nogroup.npz", **arrays)
    cases.append(("crema_d", tmp_path / "nogroup.npz", r"missing key\(s\) test_group"))
    arrays["sensors"] = np.asarray(["audio", "video"])
    np.savez(tmp_path / "sensors.npz", **arrays)
    cases.append(("crema_d", tmp_path / "sensors.npz",
                  r"sensors audio, video; crema_d needs audio, visual"))
    for name, path, message in cases:
        with pytest.raises(DataError, match=message):
            load_dataset(name, {"path": str(path)}, 0)


def _scenario(tmp_path: Path, dataset: dict, chain: list[str], tiers: list[list[str]],
              **extra) -> dict:
    sc = {"name": f"tiny_{dataset['name']}", "seed": 0, "rounds": len(chain),
          "method": "fedmchain", "dataset": dataset,
          "population": {"devices": len(tiers), "tiers": [{"sensors": t, "count": 1}
                                                          for t in tiers],
                         "partition": {"kind": "dirichlet", "alpha": 1.0, "min_samples": 3}},
          "model": {"embed_dim": 8, "hidden": 16},
          "training": {"batch_size": 8, "lr": 1e-3, "optimizer": "adam", "sync_every": 1},
          "selection": {"name": "fraction", "fraction": 1.0, "k": len(tiers)},
          "schedule": {"name": "modality_chain", "chain": chain},
          "aggregation": {"clusters": 2}, "eval": {"every": 1},
          "execution": {"executor": "serial"}, "output": {"tensorboard": False}}
    return sc | extra


def test_missing_file_is_reported_by_validate_and_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(_scenario(tmp_path, {"name": "cmu_mosei"},
                                          ["text", "audio", "visual"],
                                          [["text"], ["audio"], ["visual"]])))
    out = tmp_path / "runs"
    for argv in (["validate", str(p)], ["run", str(p), "--out", str(out), "--no-progress"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"data file not found: {tmp_path / 'cmu_mosei.npz'}" in err, err
        assert "Traceback" not in err
    _har_file(tmp_path / "cmu_mosei.npz")
    assert main(["run", str(p), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a file of `raymm data prepare cmu-mosei`" in err, err
    assert not out.exists()


def test_training_on_the_test_split_needs_per_device_evaluation(tmp_path):
    raw = _scenario(tmp_path, {"name": "crema_d", "train_pool": "all"}, ["audio", "visual"],
                    [["audio"], ["visual"]], eval={"scope": "pooled"})
    with pytest.raises(ScenarioError, match="dataset.train_pool: 'all' also trains on"):
        load_scenario(raw)


# --------------------------------------------------------------------------- end to end

def _crema_release(tmp_path: Path) -> Path:
    crema(tmp_path / "CREMA-D", actors=tuple(range(1001, 1013)))
    return prepare("crema-d", tmp_path / "CREMA-D", tmp_path / "crema_d.npz", **AV).path


def _ave_release(tmp_path: Path) -> Path:
    cats = ("Dog", "Church bell", "Helicopter")
    ave(tmp_path, split_files=False, rows=[(cats[v % 3], v % 2, v % 2 + 1) for v in range(16)])
    return prepare("ave", tmp_path, tmp_path / "ave.npz", test_fraction=0.25, **AV).path


def _mosei_release(tmp_path: Path) -> Path:
    return prepare("cmu-mosei", mosei_random_pickle(tmp_path / "m.pkl"),
                   tmp_path / "cmu_mosei.npz").path


AUDIO_VISUAL = (["audio", "visual"], [["audio"], ["visual"], ["audio", "visual"],
                                      ["audio", "visual"]])
RUNS = {"crema_d": (_crema_release, *AUDIO_VISUAL), "ave": (_ave_release, *AUDIO_VISUAL),
        "cmu_mosei": (_mosei_release, ["text", "audio", "visual"],
                      [["text"], ["audio"], ["visual"], ["text", "audio", "visual"]])}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_fedmchain_runs_on_the_prepared_release(name, tmp_path):
    make, chain, tiers = RUNS[name]
    path = make(tmp_path)
    sc = _scenario(tmp_path, {"name": name, "path": str(path), "train_pool": "all"}, chain,
                   tiers)
    res = raymm.run(sc, out=tmp_path / "runs")
    s = res.summary
    assert s["rounds_completed"] == len(chain)
    for key in ("final_accuracy", "final_acc_multimodal", f"final_acc_sensor/{chain[-1]}"):
        assert s[key] is not None and np.isfinite(s[key]), key
    import pyarrow.parquet as pq

    assert pq.read_table(res.run_dir / "rounds.parquet").to_pydict()["phase"] == chain


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_paper_scenario_runs_on_a_standin_of_the_release(name, tmp_path, monkeypatch):
    """The shipped scenario itself, a few rounds, on random data at the release's shapes."""
    from helpers import REPO
    from tiny_releases import write_standin

    path = REPO / "scenarios" / f"fedmchain_{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    write_standin(name, tmp_path / raw["dataset"]["path"], n_train=raw["population"]["devices"]
                  * 12, n_test=20, classes=raw["dataset"].get("classes"))
    chain = raw["schedule"]["chain"]
    res = raymm.run(path, [f"rounds={len(chain)}", "training.sync_every=1", "eval.every=1",
                           "output.tensorboard=false"], out=tmp_path / "runs", executor="serial")
    assert res.summary["rounds_completed"] == len(chain)
    assert np.isfinite(res.summary["final_accuracy"])
