"""Asking a cluster's autoscaler for the DeviceActors' resources, and waiting for them.

A cluster can grow when its autoscaler runs with node types that allow more than are up now
(`cluster.yaml`: GPU workers with `min_workers: 0`, CPU workers below their `max_workers`).
Ray's autoscaler publishes the most each resource can reach (`ClusterConfig.max_resources`);
`growable` compares that with what the cluster has. A packing that does not fit then asks for
the actors' bundles (`ray.autoscaler.sdk.request_resources`) and waits, printing a progress
line every `PROGRESS_S`, until it fits or `timeout_s` ends in a `ResourceError` with what was
needed and what came. A cluster that cannot grow (no autoscaler, or every node type at its
maximum) fails at once, as before.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import ray

from actors.packing import ResourceError

PROGRESS_S = 10.0
POLL_S = 2.0
T = TypeVar("T")


def max_resources() -> dict[str, float] | None:
    """The most of each resource the autoscaler may bring up; None without an autoscaler."""
    try:
        # deferred: Ray's private state API, read only when a packing does not fit
        from ray._private.state import state
        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - an older or autoscaler-less cluster: it cannot grow
        return None
    if config is None:
        return None
    return {k: float(v) for k, v in config.max_resources.items()}


def growable(resources: Mapping[str, float]) -> bool:
    """Whether the autoscaler may add any resource the cluster does not have now."""
    most = max_resources()
    return most is not None and any(v > resources.get(k, 0.0) + 1e-9 for k, v in most.items())


def request_resources(bundles: Sequence[Mapping[str, float]]) -> None:
    # deferred: the autoscaler's SDK, needed only when a cluster has to grow
    from ray.autoscaler.sdk import request_resources as ask

    ask(bundles=[dict(b) for b in bundles])


def fit_or_grow(fit: Callable[[Mapping[str, float]], T],
                bundles: Callable[[], Sequence[Mapping[str, float]]],
                resources: Callable[[], Mapping[str, float]], timeout_s: float,
                enabled: bool = True, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> T:
    """`fit(resources())`; when that raises ResourceError on a cluster that can grow, ask the
    autoscaler for `bundles()` and try again until it fits or `timeout_s` passes."""
    have = resources()
    try:
        return fit(have)
    except ResourceError as exc:
        if not enabled or not growable(have):
            raise
        first = exc
    wanted = list(bundles())
    request_resources(wanted)
    need = _sum(wanted)
    start = last = clock()
    print(f"raymm: the cluster is too small now ({first}); asked its autoscaler for "
          f"{_text(need)} and waiting up to {timeout_s:.0f} s", file=sys.stderr, flush=True)
    while True:
        sleep(POLL_S)
        have = resources()
        try:
            packing = fit(have)
        except ResourceError:
            pass
        else:
            print(f"raymm: the cluster grew to {_text(have, need)} after "
                  f"{clock() - start:.0f} s", file=sys.stderr, flush=True)
            return packing
        now = clock()
        if now - start >= timeout_s:
            raise ResourceError(
                f"execution: waited {timeout_s:.0f} s for the autoscaler: the DeviceActors need "
                f"{_text(need)}, the cluster has {_text(have, need)} (execution.autoscale_"
                "timeout_s; check the autoscaler's log: `ray exec cluster.yaml 'tail -n 100 "
                "/tmp/ray/session_latest/logs/monitor.*'`)")
        if now - last >= PROGRESS_S:
            last = now
            print(f"raymm: waiting for the autoscaler ({now - start:.0f} of {timeout_s:.0f} s): "
                  f"need {_text(need)}, the cluster has {_text(have, need)}",
                  file=sys.stderr, flush=True)


def _sum(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _text(res: Mapping[str, float], keys: Mapping[str, float] | None = None) -> str:
    names = list(keys if keys is not None else res)
    return ", ".join(f"{k}={_amount(k, res.get(k, 0.0))}" for k in names)


def _amount(key: str, v: float) -> str:
    return f"{v / 2**30:.2f} GiB" if key == "memory" else f"{v:g}"


def current_resources() -> dict[str, float]:
    """The cluster's resources (in a placement group: the group's, `group_resources`)."""
    group = group_resources()
    return group if group is not None else dict(ray.cluster_resources())


def group_resources() -> dict[str, float] | None:
    """The resources of the placement group this process runs in (a sweep's run on a
    cluster: its DeviceActors are made inside it), None outside one."""
    pg = ray.util.get_current_placement_group()
    if pg is None:
        return None
    table = ray.util.placement_group_table(pg)
    return _sum(list(table["bundles"].values()))
