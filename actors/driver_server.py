"""The server in the driver's process (`execution.server: driver`).

A ServerActor is a process with torch in it: ~0.3 GiB on a CPU machine, more with a CUDA
build of torch. A run short of memory on one machine can do without it: `DriverServer` offers
the ServerActor's interface (`server.plan.remote(...)` returns object references) and runs
each call at once in the driver, on `actors.server_actor.ServerShell`, the ServerActor's own
code. Its arguments that are references are fetched first (a device result is waited for as the
actor would); its results are put into the object store, so the DeviceActors read the plan and
the broadcast by reference exactly as from a ServerActor. The numbers are the same: the same
code runs on the same inputs in the same order. What changes: the driver waits while the server
works (a ServerActor overlaps with the driver's bookkeeping), and a failing call (an input from
an actor that died) yields a reference that raises a RayError when read, as an actor task's
would, so the executor's recovery is unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from actors.server_actor import ServerShell


@ray.remote(num_cpus=0)
def _fail(error: BaseException) -> None:
    """A reference that raises `error` (as a RayTaskError) when read."""
    raise error


def _fetch(value: Any) -> Any:
    return ray.get(value) if isinstance(value, ray.ObjectRef) else value


class _Call:
    def __init__(self, method: Callable[..., Any], num_returns: int) -> None:
        self.method, self.num_returns = method, num_returns

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        try:
            out = self.method(*map(_fetch, args), **{k: _fetch(v) for k, v in kwargs.items()})
        except ray.exceptions.RayError as error:  # an input's task or actor failed
            refs = [_fail.remote(error) for _ in range(self.num_returns)]
            return refs[0] if self.num_returns == 1 else tuple(refs)
        if self.num_returns == 1:
            return ray.put(out)
        return tuple(ray.put(part) for part in out)


class DriverServer:
    """The ServerActor's handle, served in this process."""

    def __init__(self) -> None:
        self.shell = ServerShell()

    def __getattr__(self, name: str) -> _Call:
        method = getattr(self.shell, name)
        # `@ray.method(num_returns=2)` marks ServerShell.plan for Ray; the same mark here
        return _Call(method, int(getattr(method, "__ray_num_returns__", 1)))
