"""One run of a sweep on a Ray cluster: its driver as an actor, its files brought back.

`RemoteRun` reserves a placement group for the run (one bundle per DeviceActor, on one node
when a node has room for all of them: `STRICT_PACK`, else `PACK`), starts a `RunDriver` actor
in it and calls the given function there with a scratch run directory on that node. The group
captures what the driver creates, so the run's DeviceActors go into its bundles, beside their
driver (the ServerActor has no resources and is placed on the driver's node). While the run
goes, `pull` asks the driver for the files that changed since the last pull (config, rounds,
summary, TensorBoard events, checkpoints, the model: everything in the run directory but
hidden temp files) and writes them under the local run directory, each atomically, removing
those the run removed (older checkpoints): what was pulled last is always a consistent run
directory that `raymm run --resume` or the next sweep continues from. A run that continues
sends its local files first (`files`), so the driver resumes from them wherever it lands.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.ray_executor import ensure_ray
from raymm.config.schema import ExecutionSpec
from raymm.io.atomic import atomic_output
from raymm.io.paths import CONFIG_FILE

#: a file's identity for `pull`: (size, mtime in ns)
Stamp = tuple[int, int]


@ray.remote(num_cpus=0, max_concurrency=2)  # type: ignore[call-overload]  # typed without it
class RunDriver:
    """A run's driver: runs `fn(run_dir, *args)` in a scratch folder of its node and answers
    `changed` (from another thread) meanwhile."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="raymm-run-"))
        self.run_dir = self.root / "run"
        for rel, data in files.items():
            dest = self.run_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        self.sent: dict[str, Stamp] = {}

    def where(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self.run_dir, *args)

    def changed(self) -> dict[str, bytes | None]:
        """Files new or changed since the last call (relative path -> bytes), and None for
        those gone since."""
        now: dict[str, Stamp] = {}
        out: dict[str, bytes | None] = {}
        if self.run_dir.is_dir():
            for path in sorted(self.run_dir.rglob("*")):
                if not path.is_file() or any(p.startswith(".") for p in
                                             path.relative_to(self.run_dir).parts):
                    continue
                rel = str(path.relative_to(self.run_dir))
                try:
                    st = path.stat()
                    stamp = (st.st_size, st.st_mtime_ns)
                    if self.sent.get(rel) != stamp:
                        out[rel] = path.read_bytes()
                except FileNotFoundError:  # replaced or removed while we looked
                    continue
                now[rel] = stamp
        out.update({rel: None for rel in self.sent if rel not in now})
        self.sent = now
        return out

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def write_changes(run_dir: Path, changes: Mapping[str, bytes | None]) -> None:
    """Apply `RunDriver.changed` to the local run directory: `config.yaml` first, then the
    other files, removals last. A pull cut short (the sweep killed) then never leaves a run's
    files without its `config.yaml`: a folder the next sweep would refuse as not a run
    directory (the changes come in path order, and `checkpoints/` sorts before it)."""
    for rel, data in sorted(changes.items(), key=lambda kv: (kv[1] is None, kv[0] != CONFIG_FILE)):
        dest = run_dir / rel
        if data is None:
            dest.unlink(missing_ok=True)
            continue
        with atomic_output(dest) as f:
            f.write(data)


def read_files(run_dir: Path) -> dict[str, bytes]:
    """A local run directory's files, to continue the run elsewhere."""
    if not run_dir.is_dir():
        return {}
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and not any(s.startswith(".") for s in p.relative_to(run_dir).parts)}


def fits_one_node(bundles: Sequence[Mapping[str, float]]) -> bool:
    """Whether some alive node has room for all the bundles together (its total resources)."""
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    return any(all(node["Resources"].get(k, 0.0) + 1e-9 >= v for k, v in need.items())
               for node in ray.nodes() if node["Alive"])


def slots(bundles: Sequence[Mapping[str, float]]) -> int:
    """How many runs of these bundles the cluster's nodes hold at once (each run on one node
    when it fits there; else counted over the whole cluster)."""
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    if not need:
        return 1
    alive = [n["Resources"] for n in ray.nodes() if n["Alive"]]

    def times(res: Mapping[str, float]) -> int:
        return min(int(res.get(k, 0.0) / v + 1e-9) for k, v in need.items())

    per_node = sum(times(r) for r in alive)
    if per_node:
        return per_node
    total: dict[str, float] = {}
    for r in alive:
        for k, v in r.items():
            total[k] = total.get(k, 0.0) + v
    return max(1, times(total))


class RemoteRun:
    """A run's placement group and driver; `close` gives both back."""

    def __init__(self, bundles: Sequence[Mapping[str, float]], files: Mapping[str, bytes],
                 runtime_env: dict[str, Any] | None = None) -> None:
        strategy = "STRICT_PACK" if fits_one_node(bundles) else "PACK"
        self.group = placement_group([dict(b) for b in bundles], strategy=strategy)
        self.driver: Any = None
        ray.get(self.group.ready())
        options: dict[str, Any] = {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            self.group, placement_group_bundle_index=0,
            placement_group_capture_child_tasks=True)}
        if runtime_env:
            options["runtime_env"] = runtime_env
        self.driver = RunDriver.options(**options).remote(dict(files))  # type: ignore[attr-defined]
        self.node: dict[str, Any] = ray.get(self.driver.where.remote())

    def start(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.driver.run.remote(fn, *args)

    def pull(self, run_dir: Path) -> None:
        write_changes(run_dir, ray.get(self.driver.changed.remote()))

    def close(self) -> None:
        if self.driver is not None:
            try:
                ray.get(self.driver.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - its node may be gone: nothing to clean there
                pass
            ray.kill(self.driver)
        remove_placement_group(self.group)


def wait(ref: Any, timeout: float) -> bool:
    """Whether `ref` is ready within `timeout` seconds."""
    ready, _ = ray.wait([ref], timeout=timeout)
    return bool(ready)


def get(ref: Any) -> Any:
    return ray.get(ref)


def connect(address: str | None) -> None:
    """Join the cluster (`auto`: RAY_ADDRESS), quietly, unless already connected."""
    ensure_ray(ExecutionSpec(address=address or "auto"))
