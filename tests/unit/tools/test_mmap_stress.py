"""tools/mmap_stress.py at a few MiB: every case runs in a child process, and the
table and the JSON say what was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO, load_script


def test_the_stress_table_at_a_small_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    mod = load_script(REPO / "tools" / "mmap_stress.py", "mmap_stress")
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(mod, "BASE", ["dataset.n_train=2200", "dataset.n_test=64", "rounds=2",
                                      "dataset.sensors.a.dim=8", "dataset.sensors.b.dim=8"])
    monkeypatch.setattr(mod, "SMALL", ["dataset.n_train=1100", "dataset.clients=500",
                                       "population.devices=500"])
    rows = mod.main(["--out", str(tmp_path / "out"), "--executors", "serial",
                     "--delete-data"])
    assert [(r["case"], r["cache"]) for r in rows] == [
        ("tiny, mapped", "warm"), ("large, mapped", "cold"), ("large, mapped", "warm"),
        ("small, mapped", "cold"), ("small, mapped", "warm"), ("small, in memory", "-")]
    assert all(r["tree_pss_peak_gib"] > 0 and r["steady_s_per_round"] > 0 for r in rows)
    # the resident set is sampled too (None without the privilege to read frame numbers)
    assert all(r["tree_resident_peak_gib"] is None
               or r["tree_resident_peak_gib"] >= 0.5 * r["tree_pss_peak_gib"] for r in rows)
    # the same data and seed: mapped or in memory, the same model
    assert len({r["final_accuracy"] for r in rows[3:]}) == 1
    saved = json.loads((tmp_path / "out" / "mmap_stress.json").read_text())
    assert saved["dataset"]["bytes"] > saved["small_dataset"]["bytes"] > 0
    assert "| small, in memory | serial |" in (tmp_path / "out" / "table.md").read_text()
    assert not any((tmp_path / "data" / "synthetic_mmap").iterdir())    # --delete-data
