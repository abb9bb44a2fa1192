"""The seams' contract (raymm.protocol.seams): every hook has a default on its base class, and
`combinable` is a claim of the class that writes the reduce, never inherited by a subclass
that changes the weights."""

from __future__ import annotations

import numpy as np
import pytest

from policies.aggregation.delta_mean import DeltaMean
from policies.aggregation.fedavg import FedAvg
from policies.aggregation.tide import TideAggregation, TideAggregationParams
from raymm.app.api import run
from raymm.protocol import combine
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import (
    AggregationContext,
    Aggregator,
    Objective,
    Schedule,
    SelectionContext,
    Selector,
)

from helpers import tiny_scenario


class ByDoubleCount(FedAvg):
    """FedAvg with its own per-row weights (twice the sample counts: the same mean), written
    the way a newcomer would: override `weights()`, nothing else."""

    def weights(self, group: str, batch: UpdateBatch, ctx: AggregationContext
                ) -> np.ndarray | None:
        return 2.0 * batch.group_weights(group)


def test_a_subclass_that_changes_the_weights_does_not_inherit_combinable():
    assert FedAvg.combinable and not ByDoubleCount.combinable
    assert DeltaMean.combinable  # changes only what the mean becomes (`merge`): still a mean

    class Reclaimed(ByDoubleCount):  # a class may state the claim again, for its own reduce
        combinable = True

        def weights(self, group: str, batch: UpdateBatch, ctx: AggregationContext
                    ) -> np.ndarray | None:
            return None

    assert Reclaimed.combinable
    # set per instance from the parameters: TIDE's data weighting is a plain weighted mean
    assert not TideAggregation.combinable
    assert TideAggregation(TideAggregationParams(weighting="data")).combinable
    assert not TideAggregation(TideAggregationParams(weighting="evidence")).combinable


def test_the_accident_cannot_happen_in_a_run(tmp_path, monkeypatch):
    """Blocks of 4 ids over 12 devices on one host, so hosts pre-sum whenever the aggregator
    claims `combinable`. The weights() subclass runs (every row arrives) and gives FedAvg's
    numbers; had it inherited the claim, the round would fail on pre-summed rows."""
    monkeypatch.setattr(combine, "BLOCK", 4)
    sc = tiny_scenario(**{"rounds": 2, "selection.k": 10, "execution.devices_per_actor": 12})
    ref = run(sc, out=tmp_path / "fedavg").params
    monkeypatch.setitem(AGGREGATORS._classes, "fedavg", ByDoubleCount)
    got = run(sc, out=tmp_path / "double").params
    for g in ref:
        np.testing.assert_allclose(got[g], ref[g], rtol=1e-6, atol=1e-7)
    monkeypatch.setattr(ByDoubleCount, "combinable", True)  # the inherited claim, by hand
    with pytest.raises((KeyError, ValueError)):  # the rows weights() reads never arrived
        run(sc, out=tmp_path / "claimed")


def test_the_defaults_are_safe():
    class Everyone(Selector):
        def select(self, ctx: SelectionContext) -> np.ndarray:
            return ctx.eligible

    class Same(Aggregator):
        def aggregate(self, params, batch, ctx):  # type: ignore[no-untyped-def]
            return dict(params)

    sel, agg = Everyone(), Same()
    assert sel.round_stats() == {} and sel.state_dict() == {}
    assert Selector.check_scenario(None, None, None) == []
    assert not (agg.combinable or agg.takes_deltas or agg.personal)
    assert agg.extras(1) == {} and agg.cluster_models() is None and agg.eval_extras() == {}
    assert not sel.overrides(Selector.state_dict) and sel.overrides(Selector.select)
    assert Schedule.final_stage_start == 1
    class Fixed(Schedule):  # the seam's required methods only
        def active_groups(self, round, groups):  # type: ignore[no-untyped-def]
            return tuple(groups)

        def eligible(self, round, sensor_mask, sensors):  # type: ignore[no-untyped-def]
            return np.ones(len(sensor_mask), bool)

        def phase(self, round):  # type: ignore[no-untyped-def]
            return "all"

    class Plain(Objective):
        def loss(self, inp):  # type: ignore[no-untyped-def]
            return inp

    plain = Fixed()
    assert plain.phase_span(3) is None and plain.frozen_groups(3) == ()
    obj = Plain()
    assert not (obj.uses_adapter or obj.vectorisable or obj.split_adapter or obj.needs_grad_mean)
    assert obj.device_finish(None) == ({}, {})  # type: ignore[arg-type]
