"""Small scenario builders shared by tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: a run's rows for the budget metrics by hand (Acc@B, the summary, comparison tables): four
#: rounds, three evaluated, bytes in GiB (raymm.units.GIB)
BUDGET_ROWS = [
    {"round": 5, "bytes_total": 0.25 * 2**30},
    {"round": 10, "accuracy": 0.5, "bytes_total": 0.5 * 2**30, "tier_f1": 0.4,
     "worst_drop": 0.3, "worst_drop_sensor": "b"},
    {"round": 20, "accuracy": 0.7, "bytes_total": 1.0 * 2**30, "tier_f1": 0.6,
     "worst_drop": 0.2, "worst_drop_sensor": "a", "acc_tier/a": 0.55},
    {"round": 30, "accuracy": 0.6, "bytes_total": 1.5 * 2**30, "tier_f1": 0.65,
     "worst_drop": 0.1, "worst_drop_sensor": "a"},
]


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


def tiny_run_params(overrides: dict) -> tuple[dict, list[dict]]:
    """The final parameters and the rows of a three-round `tiny_scenario` run with `overrides`
    (`run(out=None)`: under ./runs, so the calling test module changes to its tmp_path)."""
    from raymm.app.api import run
    from raymm.app.build import load_scenario

    res = run(load_scenario(tiny_scenario(**{"rounds": 3, **overrides})), out=None)
    return res.params, res.rows


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


def async_arrivals(trained: Any, bases: Any, staleness: Any, samples: Any) -> Any:
    """`Arrivals` of one group "g" for the asynchronous aggregators' arithmetic: device i sent
    `trained[i]`, trained from `bases[i]`, `staleness[i]` versions late, on `samples[i]`."""
    import numpy as np

    from raymm.protocol.asynchrony import Arrivals

    trained = np.asarray(trained, np.float32)
    return Arrivals(np.arange(len(trained), dtype=np.int64), np.asarray(samples, np.int64),
                    np.asarray(staleness, np.int64), {"g": trained},
                    {"g": trained - np.asarray(bases, np.float32)},
                    {"g": np.arange(len(trained), dtype=np.int64)})


def assert_identical_datasets(a: Any, b: Any) -> None:
    """Two loaded datasets (`raymm.data.Dataset`) hold the same bytes: labels and every
    sensor's inputs, train and test."""
    for sa, sb in ((a.train, b.train), (a.test, b.test)):
        assert sa.y.tobytes() == sb.y.tobytes()
        for s in a.sensors:
            assert sa.x[s].tobytes() == sb.x[s].tobytes()


def host_result(ids: list[int], n: list[int], updates: dict[str, Any],
                senders: dict[str, Any]) -> Any:
    """A host's `HostResult` by hand: device ids, sample counts, each group's rows and the
    positions (in `ids`) of the devices that sent it; zero compute times and losses."""
    import numpy as np

    from raymm.protocol.messages import HostResult

    k = len(ids)
    return HostResult(np.array(ids), np.array(n), np.zeros(k), np.zeros(k),
                      {g: np.array(v, np.float32) for g, v in updates.items()},
                      {g: np.array(s) for g, s in senders.items()})


def mmap_params(path: Path, **kw: object) -> dict:
    """Parameters of a small `synthetic_mmap` dataset in `path` (600 rows, 6 clients, a vector
    and a series sensor), `kw` replacing any."""
    return {"path": str(path), "n_train": 600, "n_test": 90, "classes": 3, "clients": 6,
            "sensors": {"a": {"dim": 5, "informativeness": 1.0},
                        "b": {"dim": 3, "length": 4, "informativeness": 0.5}}, **kw}


def same_arrays(a: Any, b: Any) -> bool:
    """Whether two loaded datasets hold equal arrays (mapped or in memory)."""
    import numpy as np

    return all(np.array_equal(sa.y, sb.y) and
               all(np.array_equal(sa.x[m], sb.x[m]) for m in a.sensors)
               for sa, sb in ((a.train, b.train), (a.test, b.test)))


def mcft_run(lockstep: bool, *overrides: str, per_host: int = 5) -> tuple[Any, list[float]]:
    """Six rounds of the shipped FedMChain scenario (three chain phases, sync every 2 rounds)
    on the serial executor, lock-step or sequential: (the executor, each round's train loss)."""
    from raymm.app.build import build_world, load_scenario
    from raymm.sim.engine import run_round
    from raymm.sim.serial import SerialExecutor

    sc = load_scenario(REPO / "scenarios" / "fedmchain_synthetic.yaml",
                       ["rounds=6", "training.sync_every=2", "eval.every=3",
                        "execution.training.path="
                        f"{'lockstep' if lockstep else 'sequential'}", *overrides])
    world = build_world(sc)
    ex = SerialExecutor(devices_per_host=per_host)
    ex.start(world)
    losses = [run_round(ex, t, sc).row["train_loss"] for t in range(1, sc.rounds + 1)]
    return ex, losses


def tide_observations() -> Any:
    """5 devices: 0 holds both sensors (tier of 1), 1, 2, 4 the first only (3), 3 the second
    only (1). Data sizes 100, 50, 200, 100, 0; device 0 trained twice (1 s, 3 s), device 1 once
    (3 s), the others never. TIDE's selection and aggregation tests read them."""
    import numpy as np

    from raymm.protocol.observations import Observations

    mask = np.array([[1, 1], [1, 0], [1, 0], [0, 1], [1, 0]], dtype=bool)
    obs = Observations.register(mask, np.array([0, 1, 1, 2, 1]))
    obs.observe_online(np.arange(5), np.array([100, 50, 200, 100, 0]))
    obs.observe_trained(np.array([0, 1]), np.array([1.0, 3.0]))
    obs.observe_trained(np.array([0]), np.array([3.0]))
    return obs
