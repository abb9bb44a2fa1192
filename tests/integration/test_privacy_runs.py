"""A private run gives the same numbers serially, on Ray and across a resume (issue 33).

The server's noise comes from (seed, round, SERVER, "privacy/noise/<group>"), a device's local
noise from (seed, round, device, "privacy/local"), adaptive clipping's count noise from
(seed, round, SERVER, "privacy/count"); the adaptive bound C, the participation counts and the
accountant's books are in the checkpoint (`PrivacyLedger.state_dict`). So where a run is
executed, and whether it was interrupted, must not change a single number.
"""

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.driver.checkpoint import load

from helpers import resume_from_round_3, tiny_scenario

#: central DP with adaptive clipping (C moves every release), and local DP
CENTRAL = {"mode": "central", "noise_multiplier": 0.8, "clip": 0.5, "adaptive_clip": True,
           "clip_lr": 0.5}
LOCAL = {"mode": "local", "noise_multiplier": 0.3, "clip": 0.5}


def scenario(privacy: dict[str, Any], executor: str = "serial") -> dict[str, Any]:
    return tiny_scenario(**{"rounds": 7, "eval.every": 2, "output.checkpoint_every": 3,
                            "execution.executor": executor, "execution.devices_per_actor": 6,
                            "privacy": privacy})


def table(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


def assert_same_run(a: Any, b: Any) -> None:
    """Every parameter equal bit for bit, every column of every round (ε, C, accuracy) too."""
    assert a.params.keys() == b.params.keys()
    for g in a.params:
        assert np.array_equal(np.asarray(a.params[g]), np.asarray(b.params[g])), g
    pd.testing.assert_frame_equal(table(a.run_dir), table(b.run_dir), check_exact=True)


def test_private_run_resumes_exactly(tmp_path: Path) -> None:
    """Central DP with adaptive clipping, resumed from its round-3 checkpoint: the C in force
    after round 3 (not the configured 0.5) comes back from the checkpoint, and rounds 4-7 draw
    the same noise as the uninterrupted run."""
    ref = run(scenario(CENTRAL), out=tmp_path)
    rounds = table(ref.run_dir)
    clips = rounds["privacy/clip"].tolist()
    assert clips[0] != 0.5 and len(set(clips)) == len(clips)  # C moved at every release
    ck = load(ref.run_dir)
    assert ck.round == 6 and ck.server["privacy"]["clip"] == clips[5]
    assert rounds["privacy/epsilon"].is_monotonic_increasing
    res = resume_from_round_3(tmp_path, ref)
    assert res.summary["rounds_completed"] == 7
    assert_same_run(ref, res)
    assert res.summary["privacy"] == ref.summary["privacy"]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("privacy", [CENTRAL, LOCAL], ids=["central-adaptive", "local"])
def test_private_run_on_ray_equals_serial_and_resumes(tmp_path: Path, ray_session: Any,
                                                      privacy: dict[str, Any]) -> None:
    serial = run(scenario(privacy), out=tmp_path / "serial")
    on_ray = run(scenario(privacy, "ray"), out=tmp_path / "ray")
    assert_same_run(serial, on_ray)
    res = resume_from_round_3(tmp_path, on_ray)
    assert_same_run(serial, res)


def test_local_target_epsilon_run_adds_the_solved_noise(tmp_path: Path, monkeypatch) -> None:
    """Local DP with σ solved for a target ε: every device adds N(0, (σC)²) with the σ the
    run reports (the devices once read the scenario's unset σ and added nothing)."""
    from raymm.protocol import privacy as device_privacy
    stds: list[float] = []
    real = device_privacy.local_noise

    def spy(seed: int, rnd: int, device: int, update: Any, std: float) -> Any:
        stds.append(std)
        return real(seed, rnd, device, update, std)
    monkeypatch.setattr(device_privacy, "local_noise", spy)
    target = {"mode": "local", "target_epsilon": 4.0, "on_target": "calibrate", "clip": 0.5}
    res = run(tiny_scenario(**{"rounds": 3, "privacy": target}), out=tmp_path)
    sigma = res.summary["privacy"]["noise_multiplier"]
    assert sigma > 0 and stds and set(stds) == {sigma * 0.5}
    assert len(stds) == sum(r["participated"] for r in table(res.run_dir).to_dict("records"))
    assert res.summary["privacy"]["epsilon"] <= 4.0


def test_secret_poisson_run_resumes_without_the_secret_in_its_files(
        tmp_path: Path, monkeypatch) -> None:
    """A Poisson cohort from a secret stream (given by RAYMM_SELECTION_SECRET): the secret is
    in no file a run publishes, the cohorts differ from the published seed's, and a resume
    from the checkpoint (the trusted server's own state) draws the same cohorts again."""
    dp = {"mode": "central", "noise_multiplier": 1.0, "clip": 0.5, "sampling": "poisson"}
    sc = scenario(dp)
    sc["population"]["availability"] = [{"pattern": "always"}]
    public = run(sc, out=tmp_path / "public")
    monkeypatch.setenv("RAYMM_SELECTION_SECRET", "424242")
    ref = run(sc, out=tmp_path / "secret")
    assert "Poisson-sampled" in ref.summary["privacy"]["assumption"]
    assert "published seed" in public.summary["privacy"]["assumption"]
    assert table(ref.run_dir)["selected"].tolist() != table(public.run_dir)["selected"].tolist()
    for f in ref.run_dir.iterdir():
        if f.is_file() and f.suffix in (".yaml", ".json"):
            assert "424242" not in f.read_text(), f.name
    monkeypatch.delenv("RAYMM_SELECTION_SECRET")
    res = resume_from_round_3(tmp_path, ref)
    assert_same_run(ref, res)


def test_device_budget_stops_devices_and_the_ledger_reports_them(tmp_path: Path) -> None:
    """`device_budget`: no device takes part once one more release would pass its ε; the
    summary's per-device ledger lists each device's ε (all within the budget) and the worst."""
    dp = {"mode": "central", "noise_multiplier": 2.0, "clip": 0.5, "device_budget": 3.0}
    res = run(tiny_scenario(**{"rounds": 12, "selection.k": 8, "privacy": dp}), out=tmp_path)
    led = res.summary["privacy"]
    assert len(led["device_epsilon"]) == 12
    assert max(led["device_epsilon"]) == led["worst_device_epsilon"] == led["epsilon"] <= 3.0
    assert led["device_epsilon"][led["worst_device"]] == led["worst_device_epsilon"]
    cap = max(led["participations"])
    assert 0 < cap < 12 and led["devices_at_cap"] > 0  # the budget did stop devices
    rows = table(res.run_dir)
    assert rows["selected"].iloc[-1] < 8  # fewer than k left to pick from
