"""Memory-aware packing: each DeviceActor's memory estimated from what it will hold, the sum
refused up front when the cluster cannot hold it, an actor killed for memory named in one line;
and a cluster that can grow asked for the actors' resources (a stand-in for Ray's autoscaler
API: no real autoscaler)."""

from __future__ import annotations

import numpy as np
import pytest

from actors import autoscale
from actors.packing import ActorMemory, Packing, ResourceError, actor_demand, plan_packing
from actors.ray_executor import ActorOutOfMemory, RayExecutor, killed_for_memory
from raymm.app.build import load_scenario
from raymm.config.schema import ActorSpec, ExecutionSpec
from raymm.device.footprint import MIB, footprint

from helpers import tiny_scenario

GIB = 2**30


def test_the_estimate_counts_model_copies_states_and_rows():
    sc = load_scenario(tiny_scenario(**{"population.devices": 12, "selection.k": 6,
                                        "training.exchange": "delta",
                                        "aggregation": {"name": "delta_mean"}}))
    fp = footprint(sc)
    assert fp is not None and not fp.mapped
    # the tiny model: 8- and 6-dim sensors, float32
    assert fp.row_bytes == 8 + 4 * (8 + 6) and fp.rows_per_device == 400 / 12
    assert fp.kept_copies == 2 and fp.fixed_copies == 4 and fp.selected_share == 0.5
    parts = fp.parts(6)
    assert parts["model copies"] == fp.model_bytes * (4 + 3)
    assert parts["device states"] == fp.model_bytes * 2 * 6
    assert parts["data rows"] == int(fp.row_bytes * 400 / 12 * 6)
    assert fp.bytes(6) == sum(parts.values()) and fp.bytes(12) > fp.bytes(6)
    assert "6 device(s): base 420.0 MiB" in fp.describe(6)
    adam = footprint(load_scenario(tiny_scenario(**{"training.optimizer": "adam"})))
    assert adam is not None and adam.fixed_copies == 6


def test_mapped_data_counts_only_a_rounds_rows():
    sc = load_scenario(tiny_scenario(**{"dataset": {
        "name": "synthetic_mmap", "n_train": 1200, "n_test": 100, "clients": 12, "classes": 4},
        "population.devices": 12, "population.tiers": None,
        "population.partition": {"kind": "by_group"}, "selection.k": 3}))
    fp = footprint(sc)
    assert fp is not None and fp.mapped
    assert fp.parts(12)["data rows"] == int(fp.row_bytes * 100 * 3)   # 3 selected, not 12
    assert "mapped rows of one round" in fp.describe(12)




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


class FakeCluster:
    """Ray's resources and autoscaler API stood in for: the cluster grows by `grows` once
    the autoscaler was asked, `after` polls later (the clock moves by the polls' sleeps)."""

    def __init__(self, now: dict, most: dict | None, grows: dict, after: int = 2) -> None:
        self.now, self.most, self.grows, self.after = dict(now), most, grows, after
        self.asked: list = []
        self.polls = 0
        self.t = 0.0

    def resources(self) -> dict:
        if self.asked:
            self.polls += 1
            if self.polls == self.after:   # the new nodes come up once
                self.now = {k: self.now.get(k, 0) + self.grows.get(k, 0)
                            for k in {*self.now, *self.grows}}
        return dict(self.now)

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(autoscale, "max_resources", lambda: self.most)
        monkeypatch.setattr(autoscale, "request_resources", self.asked.append)

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _fit(actor: ActorSpec, n: int, per: int | str):
    return lambda res: plan_packing(n, per, actor, res)


def test_a_cluster_that_can_grow_is_asked_and_waited_for(monkeypatch, capsys):
    gpu = ActorSpec(num_cpus=1, num_gpus=1)
    cluster = FakeCluster({"CPU": 4}, {"CPU": 36, "GPU": 4}, {"CPU": 8, "GPU": 4}, after=12)
    cluster.install(monkeypatch)
    packing = autoscale.fit_or_grow(_fit(gpu, 40, 10), lambda: [actor_demand(gpu)] * 4,
                                    cluster.resources, 120, clock=cluster.clock,
                                    sleep=cluster.sleep)
    assert packing == Packing(10, 4)
    assert cluster.asked == [[{"CPU": 1.0, "GPU": 1.0}] * 4]
    err = capsys.readouterr().err
    assert "asked its autoscaler for CPU=4, GPU=4 and waiting up to 120 s" in err
    assert "raymm: waiting for the autoscaler (10 of 120 s): need CPU=4, GPU=4, the cluster " \
           "has CPU=4, GPU=0" in err
    assert "the cluster grew to CPU=12, GPU=4 after 24 s" in err
    print(err)


def test_waiting_ends_in_the_numbers_needed_and_available(monkeypatch, capsys):
    gpu = ActorSpec(num_cpus=1, num_gpus=1)
    cluster = FakeCluster({"CPU": 4}, {"CPU": 36, "GPU": 4}, {"GPU": 1}, after=1)
    cluster.install(monkeypatch)
    with pytest.raises(ResourceError) as err:
        autoscale.fit_or_grow(_fit(gpu, 40, 10), lambda: [actor_demand(gpu)] * 4,
                              cluster.resources, 30, clock=cluster.clock, sleep=cluster.sleep)
    assert str(err.value).startswith("execution: waited 30 s for the autoscaler: the "
                                     "DeviceActors need CPU=4, GPU=4, the cluster has CPU=4, "
                                     "GPU=")
    print(err.value)


def test_a_fixed_cluster_fails_at_once(monkeypatch):
    gpu = ActorSpec(num_cpus=1, num_gpus=1)
    for most in (None, {"CPU": 4}):     # no autoscaler; one already at its maximum
        cluster = FakeCluster({"CPU": 4}, most, {"GPU": 4})
        cluster.install(monkeypatch)
        with pytest.raises(ResourceError, match="need CPU=4, GPU=4 but the cluster has "
                                                "CPU=4, GPU=0"):
            autoscale.fit_or_grow(_fit(gpu, 40, 10), lambda: [actor_demand(gpu)] * 4,
                                  cluster.resources, 30, clock=cluster.clock,
                                  sleep=cluster.sleep)
        assert not cluster.asked
    cluster = FakeCluster({"CPU": 4}, {"GPU": 4}, {"GPU": 4})
    cluster.install(monkeypatch)
    with pytest.raises(ResourceError):   # execution.autoscale: off
        autoscale.fit_or_grow(_fit(gpu, 40, 10), lambda: [actor_demand(gpu)] * 4,
                              cluster.resources, 30, enabled=False)
    assert not cluster.asked
