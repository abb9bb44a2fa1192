"""Asking a cluster's autoscaler for the DeviceActors' resources (actors.autoscale), against a
stand-in for Ray's resources and autoscaler API (no real autoscaler): a cluster that can grow
is asked and waited for, waiting ends in the numbers needed and available, a fixed cluster
fails at once."""

from __future__ import annotations

import pytest

from actors import autoscale
from actors.packing import Packing, ResourceError, actor_demand, plan_packing
from raymm.config.schema import ActorSpec


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
