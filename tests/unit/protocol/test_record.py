"""One round's record (raymm.protocol.record): merging a round's evaluation adds its columns
after the training's and the fields it sets, and keeps the others."""

from __future__ import annotations

import numpy as np

from raymm.protocol.record import RoundRecord


def test_merge_adds_the_evaluations_columns_and_the_fields_it_sets() -> None:
    selected = np.array([2, 5])
    rec = RoundRecord({"round": 4, "train_loss": 0.5}, selected=selected, diverged=[5])
    rec.merge(RoundRecord({"accuracy": 0.8, "train_loss": 0.4}, confusion=np.eye(2)))
    assert list(rec.row) == ["round", "train_loss", "accuracy"]
    assert rec.row["train_loss"] == 0.4 and rec.row["accuracy"] == 0.8
    assert rec.selected is selected and rec.diverged == [5]          # not set by the other
    assert np.array_equal(rec.confusion, np.eye(2))
    assert rec.device_epsilon is None and rec.lockstep_fallbacks == {}
