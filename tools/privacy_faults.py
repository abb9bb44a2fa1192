"""Issue 55's four privacy faults and the δ default, measured on whatever checkout this file's
imports resolve to: run it with `PYTHONPATH=<checkout>` from that checkout to compare two.

    git worktree add /tmp/wt_old d155dad
    (cd /tmp/wt_old && PYTHONPATH=. python /path/to/tools/privacy_faults.py)
    PYTHONPATH=. python tools/privacy_faults.py

Prints JSON: (1) local DP with ε = 1 solved: its reported ε and σ, and how far its parameters
are from the σ = 0 run's (0 means the devices added no noise); (2) what a local device sends
besides its update; (3) a local ledger's ε at σ 5, 20 releases, δ 1e-5; the default δ at N = 100.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path.cwd() / "tests"))
from raymm.app.api import run  # noqa: E402
from raymm.config.schema import Scenario  # noqa: E402
from raymm.protocol import privacy as device_privacy  # noqa: E402
from raymm.server import privacy as server_privacy  # noqa: E402

from helpers import tiny_scenario  # noqa: E402  (the checkout's own test helper)


def scenario(privacy: dict[str, Any]) -> dict[str, Any]:
    return tiny_scenario(**{"rounds": 3, "privacy": privacy,
                            "population.availability": [{"pattern": "always"}]})


def ledger(privacy: dict[str, Any], n: int = 100, k: int = 10, rounds: int = 20
           ) -> server_privacy.PrivacyLedger:
    sc = Scenario.model_validate({"name": "p", "rounds": rounds,
                                  "selection": {"name": "random", "k": k}, "privacy": privacy})
    pop = SimpleNamespace(n=n, sensor_mask=np.ones((n, 1), bool), sensors=("a",),
                          online=lambda t, ids: np.ones(len(ids), bool))
    joint = SimpleNamespace(eligible=lambda t, mask, sensors: np.ones(len(mask), bool))
    return server_privacy.PrivacyLedger(sc, pop, {"shared": 4}, schedule=joint)


def main() -> None:
    out: dict[str, Any] = {"checkout": str(Path(device_privacy.__file__).parents[2])}
    solved = run(scenario({"mode": "local", "target_epsilon": 1.0, "on_target": "calibrate",
                           "clip": 0.5}), out="/tmp/privacy_faults")
    silent = run(scenario({"mode": "local", "noise_multiplier": 0.0, "clip": 0.5}),
                 out="/tmp/privacy_faults")
    out["1_local_solved_sigma"] = {
        "reported_epsilon": solved.summary["privacy"]["epsilon"],
        "sigma": solved.summary["privacy"]["noise_multiplier"],
        "max_parameter_difference_from_sigma_0": max(
            float(np.abs(np.asarray(solved.params[g]) - np.asarray(silent.params[g])).max())
            for g in solved.params)}
    spec = Scenario.model_validate({"name": "p", "rounds": 1, "privacy": {
        "mode": "local", "noise_multiplier": 1.0, "clip": 1.0}}).privacy
    _, extras = device_privacy.privatize(spec, 0, 1, 0, {"shared": np.full(4, 3.0)}, None, 1.0,
                                         None)
    out["2_local_device_sends_besides_its_update"] = sorted(extras)
    led = ledger({"mode": "local", "noise_multiplier": 5.0, "clip": 1.0, "delta": 1e-5})
    for t in range(1, 21):
        led.planned(t, np.arange(100), np.arange(10), True)
        row = led.account(t)
    out["3_local_sigma5_20_releases_epsilon"] = row["privacy/epsilon"]
    out["default_delta_at_100_devices"] = server_privacy.default_delta(100)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
