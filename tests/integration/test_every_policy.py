"""Every registered aggregator and objective runs: serially, on Ray with the same numbers, and
across a checkpoint/resume with the same numbers.

The policies come from the registries themselves, so a newly registered aggregator or objective
is run here without anyone listing it. Each goes into the tiny synthetic scenario
(`helpers.tiny_scenario`: FedAvg, cross-entropy, 12 devices) with what it needs besides its own
section: deltas for an aggregator that `takes_deltas`, `exchange: personal` for a `personal`
one, and the companions listed in `NEEDS` (its method's preset, say). A policy that needs more
fails `test_every_registered_policy_is_covered_or_excused` with what `raymm validate` says is
missing; one that cannot run in a minimal scenario at all goes in `EXCUSED`, with the reason.
Policies that land in the same scenario (an aggregator and the objective it pairs with) share
one set of runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from policies import PRESETS  # (registers every policy)
from raymm.app.api import RunResult, run
from raymm.app.build import load_scenario
from raymm.errors import ScenarioError
from raymm.protocol.registry import AGGREGATORS, OBJECTIVES, Registry

from helpers import resume_from_round_3, tiny_scenario

SECTIONS: dict[str, Registry[Any]] = {"aggregation": AGGREGATORS, "objective": OBJECTIVES}

#: 4 rounds with a checkpoint at round 3 (what `resume_from_round_3` resumes from), an
#: evaluation every 2 rounds, pooled and per device (so `eval_extras`, `eval_predict` and
#: cluster models are used too)
BASE: dict[str, Any] = {"rounds": 4, "eval.every": 2, "output.checkpoint_every": 3,
                        "population.local_test_fraction": 0.25, "eval.scope": "both"}

#: what a policy needs besides its own section (keys as `tiny_scenario` takes them)
NEEDS: dict[tuple[str, str], dict[str, Any]] = {
    # FedProto: prototypes only travel, each device is evaluated with its own model
    ("aggregation", "fedproto"): {"method": "fedproto", "eval.scope": "devices"},
    ("objective", "fedproto"): {"method": "fedproto", "eval.scope": "devices"},
    # Harmony's aggregator and loss follow its two-stage schedule
    ("aggregation", "harmony"): {"method": "harmony"},
    ("aggregation", "harmony_delta"): {"method": "harmony"},
    ("objective", "harmony"): {"method": "harmony"},
    # SSCA and MCFT: FedMChain (the modality chain, late fusion, periodic sync)
    ("aggregation", "ssca"): {"method": "fedmchain"},
    ("objective", "mcft"): {"method": "fedmchain"},
    # TIDE's loss needs aux heads and the adapter; its aggregator is run with it
    ("aggregation", "tide"): {"method": "tide"},
    ("objective", "tide"): {"method": "tide"},
    # SCAFFOLD's control variates: the server's half with the devices' half
    ("aggregation", "scaffold"): {"objective": {"name": "scaffold"}},
    ("aggregation", "scaffold_delta"): {"objective": {"name": "scaffold"}},
    ("objective", "scaffold"): {"aggregation": {"name": "scaffold"}},
    # asynchronous aggregation: its preset's seconds clock; the global model evaluated only
    ("aggregation", "fedbuff"): {"method": "fedbuff", "eval.scope": "pooled"},
    ("aggregation", "fedasync"): {"method": "fedasync", "eval.scope": "pooled"},
    # BMSFed: its preset's selection reads the aggregator's published update distances
    ("aggregation", "bmsfed"): {"method": "bmsfed"},
    ("aggregation", "bmsfed_delta"): {"method": "bmsfed"},
    ("objective", "bmsfed"): {"method": "bmsfed"},
    # FLISM: the entropy-weighted server with its loss (the teacher down, the entropy up)
    ("aggregation", "flism"): {"method": "flism"},
    ("aggregation", "flism_delta"): {"method": "flism"},
    ("objective", "flism"): {"method": "flism"},
    # M3Fed: the meta-step loss and the clustering server need the consensus projection G;
    # a sync every 2 rounds so that the checkpoint falls inside a window
    ("aggregation", "m3fed"): {"method": "m3fed", "training.sync_every": 2},
    ("objective", "m3fed"): {"method": "m3fed", "training.sync_every": 2},
    # FDARN: the private branch and the modality discriminator its loss reads (its preset's
    # model keys); the private branch leaves no global model: only the devices are evaluated
    ("objective", "fdarn"): {"method": "fdarn", "eval.scope": "devices"},
    # the worked example of a broadcast extra: µ from the aggregator, read by the objective
    ("aggregation", "adaptive_prox"): {"objective": {"name": "adaptive_prox"}},
    ("objective", "adaptive_prox"): {"aggregation": {"name": "adaptive_prox"}},
}

#: (section, name) -> why it cannot be paired with a minimal scenario (none at present)
EXCUSED: dict[tuple[str, str], str] = {}

#: methods that are a preset over registered policies and model options, run here as a whole
#: (their policies are covered above; what they add is not): preset -> what it needs besides
PRESET_ONLY_METHODS: dict[str, dict[str, Any]] = {
    # BLOSSOM: block-wise means (upload: held); PH/PHF keep the head (and fusion) on each
    # device (model.private), so only the devices are evaluated
    "blossom": {},
    "blossom_ph": {"eval.scope": "devices"},
    "blossom_phf": {"eval.scope": "devices"},
    # FedMultimodal: attention fusion (model.fusion: attention) under FedAvg / the server's Adam
    "fedmultimodal": {},
    "fedmultimodal_opt": {},
    # GraMFedDHAR: attention fusion + central DP on the aggregation + TIDE's participation
    # selection
    "gramfeddhar": {},
    # RELIEF: the fusion layer's column blocks in their sensors' groups
    # (model.fusion_blocks: sensor), merged within each pod (upload: held); every online
    # device trains (all_online: more than selection.k)
    "relief": {},
}


def raw_scenario(section: str, name: str) -> dict[str, Any]:
    """The tiny scenario with `name` in `section` and what it needs."""
    kw: dict[str, Any] = {**BASE, **NEEDS.get((section, name), {})}
    preset = PRESETS[kw.get("method", tiny_scenario()["method"])]
    if section == "aggregation":
        cls = AGGREGATORS.get(name)
        # deltas with a sync every 2 rounds, so that the checkpoint falls inside a window
        # (unless the preset has its own periodic sync)
        if cls.takes_deltas and preset.get("training", {}).get("exchange") != "delta":
            kw.update({"training.exchange": "delta", "training.sync_every": 2})
        if cls.personal:
            kw["training.exchange"] = "personal"
    raw = tiny_scenario(**kw)
    if preset.get(section, {}).get("name") != name:  # else keep the preset's parameters too
        raw[section] = {"name": name}
    return raw


def plan() -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], str]]:
    """(scenario id -> raw scenario, with every policy it covers in its id;
    (section, name) -> why its scenario is invalid)."""
    by_key: dict[str, tuple[list[str], dict[str, Any]]] = {}
    invalid: dict[tuple[str, str], str] = {}
    for section, registry in SECTIONS.items():
        for name in registry.names():
            if (section, name) in EXCUSED:
                continue
            raw = raw_scenario(section, name)
            try:
                sc = load_scenario(raw)
            except ScenarioError as exc:
                invalid[(section, name)] = str(exc)
                continue
            key = json.dumps(sc.to_dict(), sort_keys=True)
            by_key.setdefault(key, ([], raw))[0].append(f"{section}={name}")
    for method, needs in PRESET_ONLY_METHODS.items():
        raw = tiny_scenario(**{**BASE, "method": method, **needs})
        try:
            sc = load_scenario(raw)
        except ScenarioError as exc:
            invalid[("method", method)] = str(exc)
            continue
        key = json.dumps(sc.to_dict(), sort_keys=True)
        by_key.setdefault(key, ([], raw))[0].append(f"method={method}")
    return {"+".join(covers): raw for covers, raw in by_key.values()}, invalid


SCENARIOS, INVALID = plan()


def covered() -> set[tuple[str, str]]:
    out = set()
    for raw in SCENARIOS.values():
        sc = load_scenario(raw)
        out |= {("aggregation", sc.aggregation.name), ("objective", sc.objective.name)}
    return out


def test_every_registered_policy_is_covered_or_excused() -> None:
    assert not INVALID, "policies whose minimal scenario does not validate (add what they " \
        "need to NEEDS, or excuse them in EXCUSED with the reason):\n" + \
        "\n".join(f"{s} {n!r}: {why}" for (s, n), why in INVALID.items())
    registered = {(s, n) for s, registry in SECTIONS.items() for n in registry.names()}
    assert set(EXCUSED) <= registered, f"excuses for unregistered policies: " \
        f"{sorted(set(EXCUSED) - registered)}"
    assert not set(EXCUSED) & covered(), "excused, yet covered"
    assert registered - set(EXCUSED) <= covered(), sorted(registered - set(EXCUSED) - covered())
    assert {("aggregation", "fedavg"), ("objective", "ce")} <= covered()


def table(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


def assert_same_run(a: RunResult, b: RunResult) -> None:
    assert a.params.keys() == b.params.keys()
    for g in a.params:
        assert np.array_equal(a.params[g], b.params[g]), g
    pd.testing.assert_frame_equal(table(a.run_dir), table(b.run_dir), check_exact=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], RunResult]:
    """The serial run of a scenario, run once for the module."""
    done: dict[str, RunResult] = {}

    def get(sid: str) -> RunResult:
        if sid not in done:
            out = tmp_path_factory.mktemp("serial")
            res = done[sid] = run(load_scenario(SCENARIOS[sid]), out=out)
            assert res.summary["rounds_completed"] == 4
            assert table(res.run_dir)["participated"].sum() > 0
        return done[sid]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("sid", sorted(SCENARIOS))
def test_resumed_run_equals_uninterrupted(sid: str, reference: Callable[[str], RunResult],
                                          tmp_path: Path) -> None:
    ref = reference(sid)
    assert_same_run(ref, resume_from_round_3(tmp_path, ref))


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("sid", sorted(SCENARIOS))
def test_ray_equals_serial(sid: str, reference: Callable[[str], RunResult], tmp_path: Path,
                           ray_session: Any) -> None:
    # one DeviceActor (devices_per_actor: 12) keeps each run to two actors: packing is
    # tested in test_equivalence.py, the policies here
    raw = {**SCENARIOS[sid], "execution": {"executor": "ray", "devices_per_actor": 12,
                                           "actor": {"num_cpus": 0.1}}}
    res = run(load_scenario(raw), out=tmp_path)
    assert res.summary["executor"] == "ray"
    assert_same_run(reference(sid), res)


def _private_blocks(run_dir: Path) -> dict[int, np.ndarray]:
    """Each device's private blocks as the run saved them (`device_models.safetensors`)."""
    from raymm.io import statefile
    from raymm.models import saved

    tree, _ = statefile.read(run_dir / saved.DEVICES, saved.DEVICES_KIND)
    return {int(d): np.asarray(own[saved.PRIVATE_KEY]) for d, own in tree["devices"].items()
            if saved.PRIVATE_KEY in own}


@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m in PRESET_ONLY_METHODS
                                    if PRESETS[m].get("model", {}).get("private")])
def test_private_blocks_survive_a_resume(method: str, reference: Callable[[str], RunResult],
                                         tmp_path: Path) -> None:
    """The blocks each device keeps (`model.private`) are checkpointed: resumed from round 3,
    every device ends with the same ones, and `raymm.load_model(run, device=d)` is the model
    with device d's own."""
    import raymm
    from raymm.models.layout import PRIVATE, GroupLayout

    sid = next(s for s in SCENARIOS if f"method={method}" in s.split("+"))
    ref = reference(sid)
    kept, again = _private_blocks(ref.run_dir), _private_blocks(
        resume_from_round_3(tmp_path, ref).run_dir)
    assert kept and kept.keys() == again.keys()
    for d in kept:
        assert np.array_equal(kept[d], again[d]), d
    d = min(kept)
    net = raymm.load_model(ref.run_dir, device=d)
    assert np.array_equal(GroupLayout(net).flatten(net, [PRIVATE])[PRIVATE], kept[d])
