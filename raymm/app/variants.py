"""The same scenario under another method: what scenario scripts use to build comparison tables.

A scenario written for one method may tune that method's policies with sections that carry no
`name` (e.g. `aggregation: {clusters: 3}` on top of the preset's SSCA). For another method those
keys are unknown, so `method_variant` drops a nameless policy section when the other method uses
a different policy there, keeping the keys of the section itself (`selection.k`). Everything
else stays, the sync period included: a fair comparison runs every method at the same rounds
and the same sync period υ (`training.sync_every`).

What a device exchanges and uploads (`training.exchange`, `training.upload`) is the other
method's. The protocol also stays when the scenario took it from its own method's preset rather than
writing it out (the TIDE preset's Adam 1e-3, evaluation every 10 rounds, early stopping): those
keys (`PROTOCOL`) are copied from the scenario's preset unless the scenario or the other
method's preset sets them.

A method that averages parameters every round (FedAvg, FedProx, SCAFFOLD, the server
optimizers, Harmony) syncs every υ rounds by exchanging deltas (`training.exchange: delta`) with
the twin of its aggregator that applies the weighted mean delta (`PERIODIC_TWIN`): devices
train locally between syncs and the server merges at syncs, as periodic averaging ("local SGD")
does. With `sync_every: 1` that is the method as it is. FedProto (`exchange: personal`) sends
its prototypes on the same windows. Local never communicates, so the sync period means nothing
to it. A method without a global model (Local, FedProto, one whose devices keep private blocks:
`model.private`, BLOSSOM's PH/PHF) is evaluated on every device's own test part: a pooled
evaluation (`eval.scope: pooled|both`) becomes `devices`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raymm.app.build import load_scenario, method_names, presets
from raymm.config.schema import Scenario, apply_overrides, read_yaml
from raymm.errors import ScenarioError
from raymm.protocol.registry import POLICY_SECTIONS

SECTIONS = tuple(POLICY_SECTIONS)
DEFAULT_NAMES = {s: Scenario.model_fields[s].default.name for s in SECTIONS}
#: keys of a policy section that belong to the section, not to its policy (kept when the
#: policy is swapped)
SECTION_KEYS = {s: set(type(Scenario.model_fields[s].default).model_fields) - {"name"}
                for s in SECTIONS}

#: aggregators of parameters -> the aggregator of deltas that does the same at a sync
PERIODIC_TWIN = {"fedavg": "delta_mean", "scaffold": "scaffold_delta",
                 "fedadam": "fedadam_delta", "fedyogi": "fedyogi_delta",
                 "fedadagrad": "fedadagrad_delta", "harmony": "harmony_delta",
                 "flism": "flism_delta", "bmsfed": "bmsfed_delta"}

#: protocol keys a scenario may take from its method's preset: kept for every method
PROTOCOL = {"training": ("optimizer", "lr", "momentum", "weight_decay", "local_epochs",
                         "batch_size"),
            "eval": ("every", "early_stop_patience")}

#: exchanges without a global model (every device is evaluated with its own)
NO_GLOBAL_MODEL = ("none", "personal")


def _name(preset: Mapping[str, Any] | None, section: str) -> str:
    return str(((preset or {}).get(section) or {}).get("name", DEFAULT_NAMES[section]))


def _keep_protocol(out: dict[str, Any], base: Mapping[str, Any] | None,
                   target: Mapping[str, Any]) -> None:
    """Copy the base preset's protocol keys the scenario left to it (in place)."""
    for section, keys in PROTOCOL.items():
        given = (base or {}).get(section) or {}
        theirs = target.get(section) or {}
        mine = out.setdefault(section, {})
        if not isinstance(mine, dict):
            continue  # the schema reports it
        for k in keys:
            if k in given and k not in mine and k not in theirs:
                mine[k] = copy.deepcopy(given[k])


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
            kept = {k: v for k, v in spec.items() if k in SECTION_KEYS[sec]}
            if kept:
                out[sec] = kept
            else:
                del out[sec]
    _keep_protocol(out, base, target)
    training = out.setdefault("training", {})
    if not isinstance(training, dict):
        raise ScenarioError([f"training: expected a mapping, got {type(training).__name__}"])
    # what a device exchanges and uploads defines a method: the other method's, not the
    # scenario's (the exchange is set below from the method and the sync period)
    training.pop("exchange", None)
    if "upload" in (target.get("training") or {}):
        training.pop("upload", None)
    every = int(sync_every if sync_every is not None else training.get("sync_every", 1))
    exchange = (target.get("training") or {}).get("exchange", "params")
    training.pop("sync_every", None)
    if exchange in ("delta", "personal"):
        training["sync_every"] = every
    elif exchange == "params" and every > 1:
        agg = _name(target, "aggregation")
        if agg not in PERIODIC_TWIN:
            raise ScenarioError([f"method {method!r}: aggregation {agg!r} has no periodic "
                                 f"form, so it cannot sync every {every} rounds"])
        training.update(exchange="delta", sync_every=every)
        # the twin takes the preset's parameters of its aggregator (e.g. a server η)
        out["aggregation"] = {**(target.get("aggregation") or {}), "name": PERIODIC_TWIN[agg]}
    ev = out.get("eval")
    model = out.get("model")
    private = (target.get("model") or {}).get("private") or \
        (isinstance(model, dict) and model.get("private"))   # blocks kept on the devices
    if (exchange in NO_GLOBAL_MODEL or private) and isinstance(ev, dict) \
            and ev.get("scope") in ("pooled", "both"):
        ev["scope"] = "devices"
    return out


def per_method_overrides(given: Sequence[str]) -> dict[str, list[str]]:
    """`METHOD:KEY=VALUE` items (a comparison script's `--set-for`) -> {method: [KEY=VALUE]}:
    overrides for one method's runs only, applied after `method_variant`."""
    out: dict[str, list[str]] = {}
    for item in given:
        method, sep, override = item.partition(":")
        if not sep or "=" not in override:
            raise ScenarioError([f"--set-for: expected METHOD:KEY=VALUE, got {item!r}"])
        out.setdefault(method, []).append(override)
    return out


def dropped_overrides(overrides: Sequence[str], variant: Mapping[str, Any]) -> list[str]:
    """A note per `--set` of a policy's parameter that `method_variant` left out of `variant`
    (the scenario's policy in that section is not the method's): the value does not reach the
    method's run, and the note says how to address the method's own policy instead."""
    notes = []
    for item in overrides:
        key = item.partition("=")[0].strip()
        section, _, rest = key.partition(".")
        if section not in SECTIONS or not rest or rest in SECTION_KEYS[section] | {"name"}:
            continue
        spec = variant.get(section)
        if not isinstance(spec, Mapping) or rest.split(".")[0] not in spec:
            theirs = _name(presets().get(str(variant.get("method"))), section)
            notes.append(f"--set {key} does not apply: the scenario's {section} policy is not "
                         f"this method's ({theirs}); add --set {section}.name={theirs} to set it "
                         f"on {theirs}")
    return notes


def method_scenarios(path: str | Path, methods: Sequence[str],
                     overrides: Sequence[str] = ()) -> tuple[list[dict[str, Any]], list[str]]:
    """The scenario at `path` once per method (`raymm.app.variants.method_variant`: same data,
    devices, rounds, protocol and sync period; the method's own policies), each named
    `<name>_<method>` (the scenario's own method keeps its name), and notes: the methods
    skipped, and each `--set` of a policy parameter that does not reach a method
    (`dropped_overrides`). `methods` is a list of preset names or ["all"]
    (`raymm.app.build.method_names`): with "all", a method that cannot run on this scenario
    (e.g. a chain of modalities on a fusion layer) is skipped with the reason; a method named
    explicitly must be valid."""
    every = list(methods) == ["all"]
    names = method_names() if every else list(methods)
    table = presets()
    unknown = [m for m in names if m not in table]
    if unknown:
        raise ScenarioError([f"--methods: unknown method(s) {', '.join(unknown)}; choose from: "
                             f"all, {', '.join(sorted(table))}"])
    base = apply_overrides(read_yaml(path), overrides)
    out, skipped, problems = [], [], []
    for m in names:
        try:
            raw = method_variant(base, m, table)
            skipped += [f"{m}: {note}" for note in dropped_overrides(overrides, raw)]
            if m != base.get("method"):
                raw["name"] = f"{base.get('name')}_{m}"
            load_scenario(raw)
        except ScenarioError as exc:
            if not every:
                problems += [f"{m}: {p}" for p in exc.problems]
            skipped.append(f"{m}: {'; '.join(exc.problems)}")
            continue
        out.append(raw)
    if problems or not out:
        raise ScenarioError(problems or skipped, str(path))
    return out, skipped
