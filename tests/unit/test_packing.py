"""Resource packing: how many devices per DeviceActor, from cluster resources (no Ray needed)."""

import pytest

from actors.packing import Packing, ResourceError, actor_capacity, plan_packing
from raymm.config import ActorSpec


def test_fractional_gpus_pack_ten_actors_per_gpu():
    actor = ActorSpec(num_cpus=0.1, num_gpus=0.1)
    cluster = {"CPU": 16.0, "GPU": 2.0}
    assert actor_capacity(actor, cluster) == 20           # GPUs bind: 2 / 0.1
    assert plan_packing(10_000, "auto", actor, cluster) == Packing(500, 20)
    assert plan_packing(10_000, 1000, actor, cluster) == Packing(1000, 10)


def test_auto_sizes_the_pool_from_cpus_and_the_population():
    one_cpu = ActorSpec(num_cpus=1)
    assert plan_packing(1000, "auto", one_cpu, {"CPU": 2.0}) == Packing(500, 2)
    assert plan_packing(1001, "auto", one_cpu, {"CPU": 2.0}) == Packing(501, 2)
    # never more actors than devices
    assert plan_packing(3, "auto", ActorSpec(num_cpus=0.1), {"CPU": 2.0}) == Packing(1, 3)
    # a custom resource limits the pool like any other
    tagged = ActorSpec(num_cpus=1, resources={"edge": 1.0})
    assert plan_packing(90, "auto", tagged, {"CPU": 64.0, "edge": 3.0}) == Packing(30, 3)


def test_a_packing_that_cannot_fit_fails_with_the_numbers():
    with pytest.raises(ResourceError, match="10 DeviceActor.*GPU=1.*GPU=0.5"):
        plan_packing(100, 10, ActorSpec(num_cpus=0, num_gpus=0.1), {"CPU": 8.0, "GPU": 0.5})
    with pytest.raises(ResourceError, match="edge=0"):
        plan_packing(10, "auto", ActorSpec(resources={"edge": 1.0}), {"CPU": 8.0})
