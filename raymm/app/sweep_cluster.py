"""A sweep on a Ray cluster: every run's driver is a Ray actor on a node with room for it.

Used when the sweep is given `--address` (`auto`: RAY_ADDRESS) or runs where RAY_ADDRESS is
set, as inside `ray job submit`. For each run a placement group reserves its DeviceActors'
resources (`actors.remote_run`): one bundle per actor with its CPUs, GPUs, custom resources
and estimated memory (`raymm.device.footprint`), on one node when one has room. A run whose
`devices_per_actor` is `auto` gets one DeviceActor, so the cluster holds as many runs as it
has room for; a fixed `devices_per_actor` gives its run that many actors' bundles, and its
actors are packed into them (`actors.autoscale.group_resources`). A run on the serial
executor takes one CPU. Runs start as slots free up, `jobs` at once at most (default: as many
as the nodes hold).

The run's driver writes into a scratch folder on its node; every `SYNC_S` seconds, and when it
ends, the files that changed come back under the sweep's `--out/runs/<run>`. Killing the sweep
kills its runs (they are its actors); the same sweep command then skips what finished and
continues the others from the newest checkpoint that came back (`output.checkpoint_every`),
uploading it to wherever the run lands next. A run that fails on the cluster is a failed run of
the sweep, as it is locally; the data must be readable on every node under the same
`RAYMM_DATA` (which the sweep passes on when set).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from raymm.app import api
from raymm.app.plugins import child_plugins, search_paths
from raymm.app.sweep_exec import Outcome, _last_line, child_input, run_in_threads
from raymm.app.sweep_plan import Action, Job
from raymm.config.strict_yaml import load_yaml
from raymm.device.footprint import footprint
from raymm.errors import Interrupted, RaymmError

SYNC_S = 5.0


def on_cluster(address: str | None) -> bool:
    """Whether a sweep runs on a Ray cluster: given an address, or RAY_ADDRESS set."""
    return address is not None or bool(os.environ.get("RAY_ADDRESS"))


def run_bundles(job: Job) -> list[dict[str, float]]:
    """The resources of the job's run: one bundle per DeviceActor (serial: one CPU)."""
    # deferred: packing's module imports Ray's side of raymm; a local sweep never needs it
    from actors.packing import ActorMemory, actor_demand

    sc = job.scenario
    ex, n = sc.execution, sc.population.devices
    memory = ActorMemory(ex.actor, footprint(sc))
    if ex.executor == "serial":
        return [{"CPU": 1.0, **({"memory": float(memory(n))} if memory(n) else {})}]
    per = n if ex.devices_per_actor == "auto" else int(ex.devices_per_actor)
    count = math.ceil(n / per)
    sizes = [min(per, n - i * per) for i in range(count)]
    bundles = [actor_demand(ex.actor, memory(s)) for s in sizes]
    # a bundle may not be empty: an actor that asks for nothing still gets a sliver of CPU
    return [b or {"CPU": 0.01} for b in bundles]


def run_on_cluster(todo: Sequence[tuple[Job, Action]], address: str | None, jobs: int | None,
                   report: Callable[[Outcome], None], plugins: Sequence[str] = ()
                   ) -> list[Outcome]:
    """Run `todo` on the cluster; the outcomes in `todo`'s order, `report` called as each
    ends."""
    # deferred: Ray is imported only by a sweep on a cluster
    from actors import remote_run

    remote_run.connect(address)
    if not todo:
        return []
    at_once = jobs or max(remote_run.slots(run_bundles(job)) for job, _ in todo)
    print(f"raymm sweep: {len(todo)} run(s) on the cluster, up to {at_once} at once",
          flush=True)
    stopping = threading.Event()
    return run_in_threads(todo, lambda job, action: _one(job, action, stopping), report,
                          at_once, "raymm-cluster", stopping.set)


def _one(job: Job, action: Action, stopping: threading.Event) -> Outcome:
    """The job on the cluster, its files pulled as it goes; anything that fails on this side
    is the job's failure."""
    # deferred: Ray is imported only by a sweep on a cluster
    from actors import remote_run

    if stopping.is_set():
        return Outcome(job, 0.0, "not started: the sweep was interrupted")
    t0 = time.perf_counter()
    run: Any = None
    try:
        if action == "restart":
            shutil.rmtree(job.run_dir)
        files = remote_run.read_files(job.run_dir) if action == "resume" else {}
        run = remote_run.RemoteRun(run_bundles(job), files, _runtime_env(job))
        print(f"raymm sweep: {job.label} {'resumes' if action == 'resume' else 'starts'} on "
              f"node {run.node['node_ip']} ({run.node['node_id'][:8]})", flush=True)
        _record_node(job, run.node)
        ref = run.start(remote_job, child_input(job, action, 1))
        while not remote_run.wait(ref, SYNC_S):
            run.pull(job.run_dir)
            if stopping.is_set():
                return Outcome(job, time.perf_counter() - t0, "stopped: the sweep was "
                               "interrupted (its newest checkpoint came back)")
        error = remote_run.get(ref)
        run.pull(job.run_dir)
        return Outcome(job, time.perf_counter() - t0, error)
    except Exception as exc:  # noqa: BLE001 - the job's failure, not the sweep's
        return Outcome(job, time.perf_counter() - t0,
                       f"on the cluster: {type(exc).__name__}: {_last_line(str(exc))}")
    finally:
        if run is not None:
            run.close()


def _record_node(job: Job, node: dict[str, Any]) -> None:
    """Where the run went, appended to its log beside the run directory."""
    job.log.parent.mkdir(parents=True, exist_ok=True)
    with open(job.log, "a", encoding="utf-8") as log:
        log.write(f"# raymm sweep: {job.label} on node {node['node_ip']} {node['node_id']} "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")


def _runtime_env(job: Job) -> dict[str, Any] | None:
    """What the run's driver needs on its node: the data root, the plugins' packages."""
    # deferred: Ray is imported only by a sweep on a cluster
    from actors.runtime_env import plugin_runtime_env

    modules = child_plugins(job.scenario)
    env = plugin_runtime_env(modules, search_paths(modules)) or {}
    if os.environ.get("RAYMM_DATA"):
        env["env_vars"] = {**env.get("env_vars", {}), "RAYMM_DATA": os.environ["RAYMM_DATA"]}
    return env or None


def remote_job(run_dir: Path, text: str) -> str:
    """Runs on the cluster, in the run's driver: the job (as `child_input` wrote it) in
    `run_dir`. Returns the failure's last line, empty when the run finished."""
    job = load_yaml(text)
    try:
        api.run(job["scenario"], resume=run_dir if job["resume"] else None, run_dir=run_dir,
                progress=False, plugins=job.get("plugins", []))
    except Interrupted as exc:
        return _last_line(str(exc)) or "interrupted"
    except RaymmError as exc:
        return _last_line(str(exc)) or type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - a bug in one run: its traceback in the worker log
        traceback.print_exc(file=sys.stderr)
        return f"{type(exc).__name__}: {exc}"
    return ""
