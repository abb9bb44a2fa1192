"""Small scenario builders shared by tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """Import a script that is not in a package (tools/*.py, experiments/*/*.py, examples/*.py)
    as a module; it is registered in sys.modules first, so its dataclasses can find it."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def tiny_scenario(**overrides: Any) -> dict[str, Any]:
    """A small two-sensor synthetic scenario that runs in well under a second per round."""
    sc: dict[str, Any] = {
        "name": "tiny", "seed": 7, "rounds": 3, "method": "fedavg",
        "dataset": {"name": "synthetic", "n_train": 400, "n_test": 100, "classes": 4,
                    "sensors": {"a": {"dim": 8, "informativeness": 1.0},
                                "b": {"dim": 6, "informativeness": 0.4}}},
        "population": {"devices": 12,
                       "tiers": [{"sensors": ["a", "b"], "count": 4},
                                 {"sensors": ["a"], "count": 4},
                                 {"sensors": ["b"], "count": 4}],
                       "availability": [{"pattern": "always", "fraction": 0.5},
                                        {"pattern": "custom", "period": 3, "online": 2,
                                         "fraction": 0.5}],
                       "partition": {"kind": "dirichlet", "alpha": 1.0, "min_samples": 5}},
        "model": {"embed_dim": 8, "hidden": 16, "fusion_dim": 16},
        "training": {"local_epochs": 1, "batch_size": 16, "lr": 0.05},
        "selection": {"name": "random", "k": 5},
        "execution": {"executor": "serial"},
        "output": {"tensorboard": False},
    }
    for key, value in overrides.items():
        node = sc
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return sc


def host_round(spec_update: dict, objective: Any = None, **sc_overrides: Any) -> tuple:
    """One round of the same plan on a sequential and a lock-step host of `tiny_scenario`:
    (sequential host, lock-step host, plan, broadcast). `spec_update` sets `training` keys and
    `execution.training` ones (chunk, closed_form), validated: a key neither has is an error."""
    import numpy as np

    from raymm.app.build import build_world, load_scenario
    from raymm.config.schema import EngineSpec, TrainingSpec
    from raymm.device.host import DeviceHost, HostSpec
    from raymm.device.lockstep_host import make_host
    from raymm.protocol.messages import Broadcast, RoundPlan
    from raymm.server.server import Server

    sc = load_scenario(tiny_scenario(**sc_overrides))
    world = build_world(sc)
    engine_keys = {k: v for k, v in spec_update.items() if k in EngineSpec.model_fields}
    training = TrainingSpec.model_validate(
        {**sc.training.model_dump(), **{k: v for k, v in spec_update.items()
                                        if k not in engine_keys}})
    engine = sc.execution.training.model_copy(update=engine_keys)
    objective = objective or world.host_spec.objective
    ids = np.arange(world.population.n)
    seq = DeviceHost(ids, world.population, world.dataset,
                     HostSpec(sc.seed, sc.model, training, objective,
                              engine=engine.model_copy(update={"path": "sequential"})))
    vec = make_host(ids, world.population, world.dataset,
                    HostSpec(sc.seed, sc.model, training, objective,
                             engine=engine.model_copy(update={"path": "lockstep"})))
    server = Server(sc, world.dataset, world.population, world.policies)
    plan = RoundPlan(2, np.array([0, 3, 4, 7, 9, 11]), tuple(server.layout.groups))
    return seq, vec, plan, Broadcast(2, server.params, {})


class Payload:
    """Unpickling this creates `marker` (a file): proof that code from a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def resume_from_round_3(tmp_path: Path, ref: Any) -> Any:
    """Copy a finished run whose first checkpoint is round 3, keep only that checkpoint and
    resume from it."""
    import shutil

    from raymm.app.api import run
    from raymm.driver.checkpoint import load

    copy = tmp_path / "copy"
    shutil.copytree(ref.run_dir, copy)
    for later in sorted((copy / "checkpoints").glob("round-*.safetensors"))[1:]:
        later.unlink()
    assert load(copy).round == 3
    return run(resume=copy)


def async_scenario(method: str = "fedbuff", **kw: Any) -> dict[str, Any]:
    """Slow devices (tens of simulated seconds per update) on 60-second availability slots,
    a third of them offline one slot in three: updates go stale and some devices leave."""
    agg = {"name": "fedbuff", "concurrency": 6, "buffer": 3} if method == "fedbuff" \
        else {"name": "fedasync", "concurrency": 4}
    return tiny_scenario(**{
        "method": method, "rounds": 7, "eval.every": 2, "output.checkpoint_every": 3,
        "aggregation": agg, "execution.devices_per_actor": 6,
        "population.hardware": [{"gflops": 3e-6, "jitter": 0.6}], **kw})
