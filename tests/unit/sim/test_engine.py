"""The round loop written once for every executor (raymm.sim.engine): `eval.scope` picks the
evaluations and names their columns."""

from __future__ import annotations

import numpy as np
import pytest

from raymm.protocol.record import RoundRecord
from raymm.sim.engine import evaluate


class _Evaluations:
    """An executor stand-in: what each evaluation returns, and the order they were asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def evaluate(self, t: int) -> RoundRecord:
        self.asked.append("pooled")
        return RoundRecord({"accuracy": 0.9, "acc_tier/a": 0.5}, confusion=np.eye(2))

    def evaluate_devices(self, t: int) -> dict:
        self.asked.append("devices")
        return {"accuracy": 0.7, "acc_tier/a": 0.6, "devices_evaluated": 3}

    def get(self, value: object) -> object:
        return value


@pytest.mark.parametrize("scope,expected", [
    ("pooled", {"accuracy": 0.9, "acc_tier/a": 0.5}),
    ("devices", {"accuracy": 0.7, "acc_tier/a": 0.6, "devices_evaluated": 3}),
    ("both", {"accuracy": 0.9, "acc_tier/a": 0.5, "personal_accuracy": 0.7,
              "personal_acc_tier/a": 0.6, "personal_devices_evaluated": 3}),
])
def test_scope_picks_the_evaluations_and_names_them(scope: str, expected: dict) -> None:
    ex = _Evaluations()
    got = evaluate(ex, 10, scope)  # type: ignore[arg-type]
    assert got.row == expected
    assert (got.confusion is not None) == (scope != "devices")  # a picture, never a column
    assert ex.asked == {"pooled": ["pooled"], "devices": ["devices"],
                        "both": ["pooled", "devices"]}[scope]
