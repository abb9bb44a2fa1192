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
