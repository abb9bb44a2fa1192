"""The same scenario under another method: what scenario scripts use to build comparison tables.

A scenario written for one method may tune that method's policies with sections that carry no
`name` (e.g. `aggregation: {clusters: 3}` on top of the preset's SSCA). For another method those
keys are unknown, so `method_variant` drops a nameless policy section when the other method uses
a different policy there. Everything else stays, the sync period included: a fair comparison
runs every method at the same rounds and the same sync period υ (`training.sync_every`).

A method that averages parameters every round (FedAvg, FedProx, SCAFFOLD) syncs every υ rounds
by exchanging deltas (`training.exchange: delta`) with the twin of its aggregator that adds the
weighted mean delta (`PERIODIC_TWIN`): devices train locally between syncs and the server
averages at syncs, as periodic averaging ("local SGD") does. With `sync_every: 1` that is the
method as it is. Local never communicates, so the sync period means nothing to it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from raymm.config import Scenario
from raymm.errors import ScenarioError
from raymm.validate import POLICY_SECTIONS

SECTIONS = tuple(POLICY_SECTIONS)
DEFAULT_NAMES = {s: Scenario.model_fields[s].default.name for s in SECTIONS}

#: aggregators of parameters -> the aggregator of deltas that does the same at a sync
PERIODIC_TWIN = {"fedavg": "delta_mean", "scaffold": "scaffold_delta"}


def _name(preset: Mapping[str, Any] | None, section: str) -> str:
    return str(((preset or {}).get(section) or {}).get("name", DEFAULT_NAMES[section]))


def method_variant(raw: Mapping[str, Any], method: str,
                   presets: Mapping[str, Mapping[str, Any]],
                   sync_every: int | None = None) -> dict[str, Any]:
    """A copy of the raw scenario mapping `raw` with `method` and without keys it cannot take,
    synced every `sync_every` rounds (default: the scenario's own `training.sync_every`)."""
    out = copy.deepcopy(dict(raw))
    base, target = presets.get(str(raw.get("method"))), presets[method]
    out["method"] = method
    for sec in SECTIONS:
        spec = out.get(sec)
        if isinstance(spec, Mapping) and "name" not in spec \
                and _name(base, sec) != _name(target, sec):
            del out[sec]
    training = out.setdefault("training", {})
    if not isinstance(training, dict):
        raise ScenarioError([f"training: expected a mapping, got {type(training).__name__}"])
    every = int(sync_every if sync_every is not None else training.get("sync_every", 1))
    exchange = (target.get("training") or {}).get("exchange", "params")
    training.pop("sync_every", None)
    if exchange == "delta":
        training["sync_every"] = every
    elif exchange == "params" and every > 1:
        agg = _name(target, "aggregation")
        if agg not in PERIODIC_TWIN:
            raise ScenarioError([f"method {method!r}: aggregation {agg!r} has no periodic "
                                 f"form, so it cannot sync every {every} rounds"])
        training.update(exchange="delta", sync_every=every)
        out["aggregation"] = {"name": PERIODIC_TWIN[agg]}
    return out
