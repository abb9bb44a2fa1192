"""Resource packing (actors.packing): how many devices per DeviceActor, from the cluster's
resources and each actor's memory (no Ray needed); a packing that cannot fit is refused with
the numbers."""

import numpy as np
import pytest

from actors.packing import (
    ActorMemory,
    Packing,
    ResourceError,
    actor_capacity,
    actor_demand,
    plan_packing,
)
from raymm.app.build import load_scenario
from raymm.config.schema import ActorSpec
from raymm.device.footprint import MIB, footprint
from raymm.protocol.combine import BLOCK

from helpers import tiny_scenario

GIB = 2**30


def test_fractional_gpus_pack_ten_actors_per_gpu():
    actor = ActorSpec(num_cpus=0.1, num_gpus=0.1)
    cluster = {"CPU": 16.0, "GPU": 2.0}
    assert actor_capacity(actor, cluster) == 20           # GPUs bind: 2 / 0.1
    assert plan_packing(4000, "auto", actor, cluster) == Packing(200, 20)
    assert plan_packing(10_000, 1000, actor, cluster) == Packing(1000, 10)


def test_auto_sizes_the_pool_from_cpus_and_the_population():
    one_cpu = ActorSpec(num_cpus=1)
    assert plan_packing(200, "auto", one_cpu, {"CPU": 2.0}) == Packing(100, 2)
    assert plan_packing(201, "auto", one_cpu, {"CPU": 2.0}) == Packing(101, 2)
    # never more actors than devices
    assert plan_packing(3, "auto", ActorSpec(num_cpus=0.1), {"CPU": 2.0}) == Packing(1, 3)
    # a custom resource limits the pool like any other
    tagged = ActorSpec(num_cpus=1, resources={"edge": 1.0})
    assert plan_packing(90, "auto", tagged, {"CPU": 64.0, "edge": 3.0}) == Packing(30, 3)


def test_auto_puts_actor_boundaries_on_whole_blocks_of_ids():
    """Each boundary is the multiple of BLOCK nearest to the even split, so every actor
    hosts whole blocks (and pre-sums all of its devices), unless that costs balance."""
    one_cpu = ActorSpec(num_cpus=1)
    p = plan_packing(1000, "auto", one_cpu, {"CPU": 2.0})
    assert p == Packing(512, 2, (0, 512))
    assert [(r[0], r[-1]) for r in p.ranges(1000)] == [(0, 511), (512, 999)]
    p = plan_packing(5000, "auto", one_cpu, {"CPU": 3.0})
    assert p.starts == (0, 1792, 3328) and p.devices_per_actor == 1792
    ranges = p.ranges(5000)
    assert np.array_equal(np.concatenate(ranges), np.arange(5000))
    assert all(r[0] % BLOCK == 0 for r in ranges)
    assert max(abs(len(r) - 5000 / 3) for r in ranges) <= BLOCK  # each end within half a block
    # the largest actor 5.6% above the even share (one actor gets a block less)
    p = plan_packing(10_000, "auto", one_cpu, {"CPU": 20.0})
    assert p.devices_per_actor == 528 and p.num_actors == 20
    assert sum(map(len, p.ranges(10_000))) == 10_000
    # fewer than a block per actor, or an actor 10% above the even share: the even split
    assert plan_packing(1000, "auto", one_cpu, {"CPU": 8.0}) == Packing(125, 8)
    assert plan_packing(600, "auto", one_cpu, {"CPU": 2.0}) == Packing(300, 2)
    # a number the user gave is kept as it is
    assert plan_packing(1000, 500, one_cpu, {"CPU": 2.0}) == Packing(500, 2)
    assert [len(r) for r in Packing(500, 2).ranges(1000)] == [500, 500]


def test_a_packing_that_cannot_fit_fails_with_the_numbers():
    with pytest.raises(ResourceError, match="10 DeviceActor.*GPU=1.*GPU=0.5"):
        plan_packing(100, 10, ActorSpec(num_cpus=0, num_gpus=0.1), {"CPU": 8.0, "GPU": 0.5})
    with pytest.raises(ResourceError, match="edge=0"):
        plan_packing(10, "auto", ActorSpec(resources={"edge": 1.0}), {"CPU": 8.0})


class PerDevice(ActorMemory):
    """base + per device, in MiB."""

    def __init__(self, base: float, per: float) -> None:
        super().__init__(ActorSpec(memory=0), None)
        self.base, self.per = base, per

    def __call__(self, devices: int) -> int:
        return int((self.base + self.per * devices) * MIB)

    def describe(self, devices: int) -> str:
        return f"{self(devices) / MIB:.0f} MiB"


def test_auto_takes_the_most_actors_whose_memory_fits():
    one_cpu = ActorSpec(num_cpus=1)
    mem = PerDevice(300, 1)
    # 8 CPUs; 8 actors of 100 devices need 8 x 400 MiB = 3.1 GiB: fits in 4 GiB
    assert plan_packing(800, "auto", one_cpu, {"CPU": 8, "memory": 4 * GIB}, mem).num_actors == 8
    # in 2 GiB: 4 actors (4 x 500 MiB); 5 would need 5 x 460 MiB
    assert plan_packing(800, "auto", one_cpu, {"CPU": 8, "memory": 2 * GIB}, mem) == \
        Packing(200, 4)


def test_a_packing_that_cannot_fit_the_memory_is_refused_with_the_numbers():
    sc = load_scenario(tiny_scenario(**{"population.devices": 12}))
    mem = ActorMemory(ActorSpec(), footprint(sc))
    with pytest.raises(ResourceError) as err:
        plan_packing(12, 3, ActorSpec(num_cpus=1), {"CPU": 8, "memory": 1 * GIB}, mem)
    text = str(err.value)
    assert text.startswith("execution: 4 DeviceActor(s) need memory=1.64 GiB (the largest: "
                           "420.") and "3 device(s): base 420.0 MiB, model" in text
    assert "but the cluster has memory=1.00 GiB" in text and "\n" not in text
    print(text)
    with pytest.raises(ResourceError, match="1 DeviceActor"):   # auto: even one is too many
        plan_packing(12, "auto", ActorSpec(num_cpus=1), {"CPU": 8, "memory": 0.2 * GIB}, mem)
    # a fixed request (MiB), and none
    fixed = ActorMemory(ActorSpec(memory=512), None)
    assert fixed(5) == 512 * MIB
    assert actor_demand(ActorSpec(), fixed(5)) == {"CPU": 1.0, "memory": 512.0 * MIB}
    assert plan_packing(12, 3, ActorSpec(memory=0), {"CPU": 8}) == Packing(3, 4)
