"""The same scenario under another method: what scenario scripts use to build comparison tables.

A scenario written for one method may tune that method's policies with sections that carry no
`name` (e.g. `aggregation: {clusters: 3}` on top of the preset's SSCA) and keys only its
exchange accepts (`training.sync_every`). For another method those keys are unknown, so
`method_variant` drops a nameless policy section when the other method uses a different policy
there, and `sync_every` when it does not exchange deltas. Everything else stays.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from raymm.config import Scenario
from raymm.validate import POLICY_SECTIONS

SECTIONS = tuple(POLICY_SECTIONS)
DEFAULT_NAMES = {s: Scenario.model_fields[s].default.name for s in SECTIONS}


def _name(preset: Mapping[str, Any] | None, section: str) -> str:
    return str(((preset or {}).get(section) or {}).get("name", DEFAULT_NAMES[section]))


def method_variant(raw: Mapping[str, Any], method: str,
                   presets: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A copy of the raw scenario mapping `raw` with `method` and without keys it cannot take."""
    out = copy.deepcopy(dict(raw))
    base, target = presets.get(str(raw.get("method"))), presets[method]
    out["method"] = method
    for sec in SECTIONS:
        spec = out.get(sec)
        if isinstance(spec, Mapping) and "name" not in spec \
                and _name(base, sec) != _name(target, sec):
            del out[sec]
    exchange = (target.get("training") or {}).get("exchange", "params")
    training = out.get("training")
    if isinstance(training, dict) and exchange != "delta":
        training.pop("sync_every", None)
    return out
