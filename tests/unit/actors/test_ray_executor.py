"""The Ray executor (actors.ray_executor), without Ray running: an actor killed for memory is
one line naming it, its devices and what it held."""

from __future__ import annotations

import numpy as np
import pytest

from actors.packing import ActorMemory
from actors.ray_executor import ActorOutOfMemory, RayExecutor, killed_for_memory
from raymm.app.build import load_scenario
from raymm.config.schema import ActorSpec, ExecutionSpec
from raymm.device.footprint import footprint

from helpers import tiny_scenario


def test_an_actor_killed_for_memory_is_one_line_naming_it():
    ray_said = ("The actor died unexpectedly before finishing this task.\n\tclass_name: "
                "DeviceActor\nThe actor's worker process was killed by Ray's memory monitor "
                "because the node was running low on memory. Task was killed due to the node "
                "running low on memory.")
    from ray.exceptions import ActorDiedError, OutOfMemoryError
    assert killed_for_memory(OutOfMemoryError("x"))
    assert killed_for_memory(RuntimeError(ray_said))
    assert not killed_for_memory(ActorDiedError())
    sc = load_scenario(tiny_scenario(**{"population.devices": 12}))
    ex = RayExecutor(ExecutionSpec())
    ex.memory = ActorMemory(ActorSpec(), footprint(sc))
    ex.blocks = [np.arange(0, 6), np.arange(6, 12)]
    with pytest.raises(ActorOutOfMemory) as err:
        ex._died(1, 4, RuntimeError(ray_said))
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("DeviceActor 1 (devices 6-11) was killed for lack of memory in "
                           "round 4 on its node; it held about ")
    assert "6 device(s): base 420.0 MiB" in text and "Ray's own words: The actor died" in text
    print(text)
