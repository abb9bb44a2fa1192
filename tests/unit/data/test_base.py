"""What validation reads of a dataset before loading it (raymm.data.base.loader_facts): each
loader's facts agree with the data it loads; HAR's and the releases' come from the file
headers."""

from __future__ import annotations

import numpy as np
import pytest


def test_the_facts_are_what_loading_gives():
    """A loader's `DataFacts` (what validation reads) agree with the loaded data."""
    from raymm.data import DATASETS, load_dataset
    from raymm.data.base import loader_facts

    specs = [("synthetic", {"n_train": 37, "classes": 3,
                            "sensors": {"a": {"dim": 3, "informativeness": 1.0},
                                        "t": {"dim": 2, "length": 5, "informativeness": 0}}}),
             ("bench", {"clients": 7, "samples_per_client": 3, "dim": 5, "classes": 4}),
             ("digits", {}), ("digits", {"test_fraction": 0.1})]
    for name, params in specs:
        loader = DATASETS[name]
        facts = loader_facts(loader, loader.Params(**params))
        data = load_dataset(name, params, 0)
        groups = None if data.train.group is None else len(np.unique(data.train.group))
        assert facts is not None
        assert (facts.n_train, facts.groups, facts.num_classes) == \
            (len(data.train), groups, data.num_classes), name
        assert dict(facts.shapes) == {m: data.sensor_shape(m) for m in data.sensors}, name


@pytest.mark.parametrize("which", ["subset", "full"])
def test_har_facts_come_from_the_file_headers(which):
    from raymm.data import DATASETS, load_dataset
    from raymm.data.base import loader_facts

    from needs import fixture, full_data

    path = fixture("har_windows_subset.npz") if which == "subset" else \
        full_data("uci_har_hapt_raw_windows.npz") / "uci_har_hapt_raw_windows.npz"
    loader = DATASETS["har"]
    facts = loader_facts(loader, loader.Params(path=str(path)))
    data = load_dataset("har", {"path": str(path)}, 0)
    assert facts is not None and facts.n_train == len(data.train) > 0
    assert facts.groups == len(np.unique(data.train.group))
    assert dict(facts.shapes) == {m: data.sensor_shape(m) for m in data.sensors}
    assert loader_facts(loader, loader.Params(path="no/such/file.npz")) is None


@pytest.mark.parametrize("name, pool", [("crema_d", "train+valid"), ("cmu_mosei", "train")])
def test_release_facts_come_from_the_file_headers(name: str, pool: str, tmp_path):
    from raymm.data import DATASETS, load_dataset
    from raymm.data.base import loader_facts

    from tiny_releases import write_standin

    path = write_standin(name, tmp_path / f"{name}.npz", n_train=30, n_test=10, groups=6)
    params = {"path": str(path), "train_pool": pool}
    loader = DATASETS[name]
    facts = loader_facts(loader, loader.Params(**params))
    data = load_dataset(name, params, 0)
    assert facts is not None
    assert (facts.n_train, facts.groups, facts.num_classes) == (
        len(data.train), len(np.unique(data.train.group)), data.num_classes)
    assert dict(facts.shapes) == {m: data.sensor_shape(m) for m in data.sensors}
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    assert loader_facts(loader, loader.Params(path=str(tmp_path / "bad.npz"))) is None
