"""What a host holds in memory, estimated before anything is loaded (raymm.device.footprint):
model copies, states and rows; of mapped data, only a round's rows."""

from __future__ import annotations

from raymm.app.build import load_scenario
from raymm.device.footprint import footprint

from helpers import tiny_scenario


def test_the_estimate_counts_model_copies_states_and_rows():
    sc = load_scenario(tiny_scenario(**{"population.devices": 12, "selection.k": 6,
                                        "training.exchange": "delta",
                                        "aggregation": {"name": "delta_mean"}}))
    fp = footprint(sc)
    assert fp is not None and not fp.mapped
    # the tiny model: 8- and 6-dim sensors, float32
    assert fp.row_bytes == 8 + 4 * (8 + 6) and fp.rows_per_device == 400 / 12
    assert fp.kept_copies == 2 and fp.fixed_copies == 4 and fp.selected_share == 0.5
    parts = fp.parts(6)
    assert parts["model copies"] == fp.model_bytes * (4 + 3)
    assert parts["device states"] == fp.model_bytes * 2 * 6
    assert parts["data rows"] == int(fp.row_bytes * 400 / 12 * 6)
    assert fp.bytes(6) == sum(parts.values()) and fp.bytes(12) > fp.bytes(6)
    assert "6 device(s): base 420.0 MiB" in fp.describe(6)
    adam = footprint(load_scenario(tiny_scenario(**{"training.optimizer": "adam"})))
    assert adam is not None and adam.fixed_copies == 6


def test_mapped_data_counts_only_a_rounds_rows():
    sc = load_scenario(tiny_scenario(**{"dataset": {
        "name": "synthetic_mmap", "n_train": 1200, "n_test": 100, "clients": 12, "classes": 4},
        "population.devices": 12, "population.tiers": None,
        "population.partition": {"kind": "by_group"}, "selection.k": 3}))
    fp = footprint(sc)
    assert fp is not None and fp.mapped
    assert fp.parts(12)["data rows"] == int(fp.row_bytes * 100 * 3)   # 3 selected, not 12
    assert "mapped rows of one round" in fp.describe(12)
