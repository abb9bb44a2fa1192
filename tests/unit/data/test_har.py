"""The HAR loader (raymm.data.har): the UCI folder layout, the npz relative to RAYMM_DATA, one
clear error for each bad data file, and the real file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raymm.data import DATASETS, dataset_params, load_dataset
from raymm.errors import DataError

from helpers import assert_identical_datasets
from needs import full_data

UCI_NAMES = ("WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING", "LAYING")


def write_uci_har_folder(root: Path, n_train: int, n_test: int, seed: int) -> dict[str, dict]:
    """A tiny UCI-HAR tree in the official layout; returns what was written (labels 1..6)."""
    rng = np.random.default_rng(seed)
    truth: dict[str, dict] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        sig = root / split / "Inertial Signals"
        sig.mkdir(parents=True)
        acc = rng.normal(1.0, 0.5, size=(n, 128, 3))
        gyro = rng.normal(0.0, 2.0, size=(n, 128, 3))
        for i, axis in enumerate("xyz"):
            np.savetxt(sig / f"total_acc_{axis}_{split}.txt", acc[:, :, i], fmt="%.7e")
            np.savetxt(sig / f"body_gyro_{axis}_{split}.txt", gyro[:, :, i], fmt="%.7e")
        y = np.arange(n) % 6 + 1
        subject = np.arange(n) // 3 + (1 if split == "train" else 20)
        np.savetxt(root / split / f"y_{split}.txt", y, fmt="%d")
        np.savetxt(root / split / f"subject_{split}.txt", subject, fmt="%d")
        truth[split] = {"acc": acc, "gyro": gyro, "y": y, "subject": subject}
    labels = "".join(f"{i + 1} {name}\n" for i, name in enumerate(UCI_NAMES))
    (root / "activity_labels.txt").write_text(labels)
    return truth


def write_har_npz(path: Path, n_train: int = 10, n_test: int = 4, **override: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        arrays[f"{split}_acc"] = rng.normal(size=(n, 128, 3)).astype(np.float32)
        arrays[f"{split}_gyro"] = rng.normal(size=(n, 128, 3)).astype(np.float32)
        arrays[f"{split}_y"] = np.arange(n, dtype=np.int64) % 6
        arrays[f"{split}_subject"] = np.arange(n, dtype=np.int64) // 2 + 1
    arrays["class_names"] = np.array(UCI_NAMES)
    arrays.update(override)
    np.savez_compressed(path, **{k: v for k, v in arrays.items() if v is not None})


def test_har_uci_folder_layout(tmp_path: Path) -> None:
    truth = write_uci_har_folder(tmp_path / "UCI HAR Dataset", n_train=12, n_test=6, seed=0)
    raw = load_dataset("har", {"path": str(tmp_path / "UCI HAR Dataset"), "standardize": False}, 0)
    assert raw.sensors == ("acc", "gyro") and raw.num_classes == 6 and raw.class_names == UCI_NAMES
    assert raw.train.x["acc"].shape == (12, 128, 3) and raw.test.x["gyro"].shape == (6, 128, 3)
    assert raw.train.x["acc"].dtype == np.float32
    np.testing.assert_allclose(raw.train.x["acc"], truth["train"]["acc"], rtol=1e-6)
    np.testing.assert_allclose(raw.test.x["gyro"], truth["test"]["gyro"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(raw.train.y, truth["train"]["y"] - 1)  # 1..6 -> 0..5
    assert raw.train.y.dtype == np.int64 and raw.train.y.min() == 0 and raw.train.y.max() == 5
    np.testing.assert_array_equal(raw.train.group, truth["train"]["subject"])
    np.testing.assert_array_equal(raw.test.group, truth["test"]["subject"])

    std = load_dataset("har", {"path": str(tmp_path / "UCI HAR Dataset")}, 0)
    for s in ("acc", "gyro"):
        x = std.train.x[s].astype(np.float64)
        np.testing.assert_allclose(x.mean(axis=(0, 1)), 0.0, atol=1e-5)
        np.testing.assert_allclose(x.std(axis=(0, 1)), 1.0, atol=1e-5)
        # test is scaled with the train statistics, not its own
        tr = raw.train.x[s].astype(np.float64)
        expect = (raw.test.x[s] - tr.mean(axis=(0, 1))) / tr.std(axis=(0, 1))
        np.testing.assert_allclose(std.test.x[s], expect, rtol=1e-4, atol=1e-5)


def test_har_npz_relative_to_raymm_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_har_npz(tmp_path / "har.npz")
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    params = dataset_params("har", {"path": "har.npz"})
    assert DATASETS["har"].required_files(params) == [tmp_path / "har.npz"]
    assert DATASETS["har"].sensors(params) == ("acc", "gyro")
    ds = load_dataset("har", params, 0)
    assert (len(ds.train), len(ds.test)) == (10, 4) and ds.class_names == UCI_NAMES
    assert ds.test.group.tolist() == [1, 1, 2, 2]
    assert_identical_datasets(ds, load_dataset("har", params, 0))


def test_har_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "har.npz"
    with pytest.raises(DataError, match="nowhere"):
        load_dataset("har", {"path": str(missing)}, 0)


def test_har_truncated_npz(tmp_path: Path) -> None:
    path = tmp_path / "har.npz"
    write_har_npz(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataError, match="har.npz"):
        load_dataset("har", {"path": str(path)}, 0)


def test_har_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "har.npz"
    path.write_text("this is not a zip file\n")
    with pytest.raises(DataError, match="har.npz"):
        load_dataset("har", {"path": str(path)}, 0)


def test_har_single_array_file(tmp_path: Path) -> None:
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "one.npy").rename(tmp_path / "har.npz")  # np.load goes by content, not name
    with pytest.raises(DataError, match=r"har\.npz: not an \.npz archive"):
        load_dataset("har", {"path": str(tmp_path / "har.npz")}, 0)


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ({"train_acc": np.zeros((10, 64, 3), np.float32)}, "train acc must be"),
        ({"test_gyro": np.zeros((4, 128), np.float32)}, "test gyro must be"),
        ({"train_y": np.zeros(9, np.int64)}, "windows but y has 9"),
        ({"test_subject": np.zeros(3, np.int64)}, "subject"),
        ({"train_y": np.full(10, 6, np.int64)}, "labels"),
        ({"test_y": None}, "missing key.*test_y"),
    ],
)
def test_har_bad_npz_layout(tmp_path: Path, override: dict, problem: str) -> None:
    path = tmp_path / "bad.npz"
    write_har_npz(path, **override)
    with pytest.raises(DataError, match=problem) as err:
        load_dataset("har", {"path": str(path)}, 0)
    assert "bad.npz" in str(err.value)


def test_har_uci_folder_missing_file(tmp_path: Path) -> None:
    write_uci_har_folder(tmp_path, n_train=6, n_test=6, seed=1)
    (tmp_path / "test" / "Inertial Signals" / "body_gyro_y_test.txt").unlink()
    with pytest.raises(DataError, match="body_gyro_y_test.txt"):
        load_dataset("har", {"path": str(tmp_path)}, 0)


@pytest.mark.data
def test_har_real_file() -> None:
    full_data("uci_har_hapt_raw_windows.npz")  # the subset: tests/unit/test_data_fixtures.py
    ds = load_dataset("har", {}, seed=0)
    assert (len(ds.train), len(ds.test)) == (7415, 2996)
    assert ds.num_classes == 6 and ds.class_names == UCI_NAMES
    assert ds.sensor_shape("acc") == (128, 3) and ds.sensor_shape("gyro") == (128, 3)
    assert set(np.unique(ds.train.y)) == set(range(6)) == set(np.unique(ds.test.y))
    assert len(np.unique(ds.train.group)) == 21 and len(np.unique(ds.test.group)) == 9
    assert not set(ds.train.group) & set(ds.test.group)
