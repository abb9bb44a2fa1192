import pytest

from actors.packing import Packing, ResourceError, actor_capacity, plan_packing
from raymm.config import ActorSpec


def test_auto_packs_as_many_actors_as_fit():
    cpu = ActorSpec(num_cpus=1)
    assert plan_packing(1000, "auto", cpu, {"CPU": 2}) == Packing(500, 2)
    assert plan_packing(3, "auto", cpu, {"CPU": 8}).devices_per_actor == 1
    gpu = ActorSpec(num_cpus=0.1, num_gpus=0.1)
    assert actor_capacity(gpu, {"CPU": 16, "GPU": 2}) == 20   # ten per GPU
    assert plan_packing(1000, "auto", gpu, {"CPU": 16, "GPU": 2}) == Packing(50, 20)


def test_explicit_packing_must_fit_with_numbers_in_the_message():
    assert plan_packing(10, 5, ActorSpec(num_cpus=1), {"CPU": 2}) == Packing(5, 2)
    with pytest.raises(ResourceError, match=r"3 DeviceActor\(s\) need CPU=3 but the cluster "
                                            r"has CPU=2"):
        plan_packing(12, 5, ActorSpec(num_cpus=1), {"CPU": 2})
    with pytest.raises(ResourceError, match="GPU=0.5 but the cluster has .*GPU=0"):
        plan_packing(10, "auto", ActorSpec(num_cpus=1, num_gpus=0.5), {"CPU": 2})
    with pytest.raises(ResourceError, match="sensor_box=1"):
        plan_packing(4, 4, ActorSpec(num_cpus=0, resources={"sensor_box": 1}), {"CPU": 2})
