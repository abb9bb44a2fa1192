"""Bring your own model: factories registered by name, the three forms a module may take, batch
norm's buffers, and what `raymm validate` refuses (all on the serial executor; a plugin's model on
Ray is tested with the plugin mechanism)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import raymm
from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.errors import ScenarioError
from raymm.models.build import build_net
from raymm.models.factory import (
    MODELS,
    ModelContext,
    ModelFacts,
    PartsNet,
    WholeNet,
    register_model,
)
from raymm.models.layout import GroupLayout

from helpers import tiny_scenario


class Parts(nn.Module):
    """A user's parts: an encoder per sensor, a fusion layer, a head, a head per sensor."""

    def __init__(self, ctx: ModelContext, width: int = 8) -> None:
        super().__init__()
        self.encoders = nn.ModuleDict({m: nn.Sequential(nn.Flatten(), nn.LazyLinear(width))
                                       for m in ctx.sensors})
        for m in ctx.sensors:  # materialise the lazy layers with the data's shapes
            self.encoders[m](torch.zeros((1,) + tuple(ctx.shapes[m])))
        self.fusion = nn.Sequential(nn.Linear(width * len(ctx.sensors), width), nn.ReLU())
        self.head = nn.Linear(width, ctx.num_classes)
        self.heads = nn.ModuleDict({m: nn.Linear(width, ctx.num_classes) for m in ctx.sensors})


class Whole(nn.Module):
    """A plain module with batch norm: inputs of every sensor concatenated, then an MLP."""

    def __init__(self, ctx: ModelContext, momentum: float | None = 0.1) -> None:
        super().__init__()
        self.sensors = ctx.sensors
        d = sum(int(np.prod(ctx.shapes[m])) for m in ctx.sensors)
        self.body = nn.Sequential(nn.Linear(d, 16), nn.BatchNorm1d(16, momentum=momentum),
                                  nn.ReLU(), nn.Linear(16, ctx.num_classes))

    def forward(self, xs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.body(torch.cat([xs[m].flatten(1) for m in self.sensors], dim=1))


@register_model("test_parts")
def make_parts(ctx: ModelContext) -> nn.Module:
    return Parts(ctx, **ctx.args)


@register_model("test_whole_bn")
def make_whole(ctx: ModelContext) -> nn.Module:
    return Whole(ctx, **ctx.args)


@register_model("test_not_a_module")
def make_tensor(ctx: ModelContext) -> torch.Tensor:  # type: ignore[return-value]
    return torch.zeros(3)  # the wrong type: validate refuses it


@register_model("test_wrong_logits")
def make_wrong(ctx: ModelContext) -> nn.Module:
    class Wrong(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(1, ctx.num_classes + 1)

        def forward(self, xs: dict[str, torch.Tensor]) -> torch.Tensor:
            return self.lin(xs[ctx.sensors[0]][:, :1])

    return Wrong()


def scenario(factory: str, **extra):
    return tiny_scenario(**{"model": {"factory": factory}, "rounds": 4, **extra})


def test_the_built_in_network_is_one_factory_among_others():
    assert {"multimodal", "test_parts", "test_whole_bn"} <= set(MODELS)
    sc = load_scenario(tiny_scenario())
    net = build_net(("a", "b"), {"a": (8,), "b": (6,)}, 4, sc.model, seed=1)
    assert type(net).__name__ == "MultimodalNet" and ModelFacts.of(net).form == "multimodal"


def test_parts_travel_as_sensor_groups_and_train(tmp_path):
    sc = load_scenario(scenario("test_parts", **{"model.args": {"width": 6},
                                                 "training.upload": "held"}))
    net = build_net(("a", "b"), {"a": (8,), "b": (6,)}, 4, sc.model, seed=1)
    assert isinstance(net, PartsNet)
    facts = ModelFacts.of(net)
    assert facts.sensor_groups and facts.sensor_heads and facts.fused and not facts.adapter
    layout = GroupLayout(net)
    assert set(layout.slots) == {"sensor:a", "sensor:b", "shared"}
    assert all(s.name.startswith(("encoders.a", "heads.a")) for s in layout.slots["sensor:a"])
    res = run(sc, out=tmp_path)
    assert res.summary["ended"] == "completed"
    before = layout.flatten(net)
    assert not np.array_equal(before["shared"], res.params["shared"])  # it trained


def test_a_whole_model_with_batch_norm_averages_its_statistics(tmp_path):
    res = run(scenario("test_whole_bn"), out=tmp_path)
    assert set(res.params) == {"shared"}
    net = raymm.load_model(res.run_dir)
    assert isinstance(net, WholeNet)
    bn = net.net.body[1]
    # the averaged running statistics travelled back: no longer the initial zeros and ones
    assert not torch.equal(bn.running_mean, torch.zeros(16))
    assert not torch.equal(bn.running_var, torch.ones(16))
    # and they are the run's own numbers: the file holds what the server ended with
    layout = GroupLayout(net)
    assert np.array_equal(layout.flatten(net, ["shared"])["shared"], res.params["shared"])
    slot_names = [s.name for s in layout.slots["shared"] if s.buffer]
    assert slot_names == ["net.body.1.running_mean", "net.body.1.running_var"]


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_numbers_do_not_depend_on_packing(tmp_path, momentum):
    """With momentum None batch norm averages over its step count: the count starts from its
    initial value for every device, so hosts holding more devices give the same numbers."""
    runs = [run(scenario("test_whole_bn", **{"model.args": {"momentum": momentum},
                                             "execution.devices_per_actor": per}),
                out=tmp_path / str(per)) for per in (1, 5, 12)]
    for other in runs[1:]:
        assert np.array_equal(runs[0].params["shared"], other.params["shared"])


def test_batch_norm_resume_is_exact(tmp_path):
    sc = scenario("test_whole_bn", **{"rounds": 6, "output.checkpoint_every": 3,
                                      "output.keep_checkpoints": 5})
    ref = run(sc, out=tmp_path / "ref")
    from helpers import resume_from_round_3

    again = resume_from_round_3(tmp_path, ref)
    assert np.array_equal(ref.params["shared"], again.params["shared"])
    a = pd.read_parquet(ref.run_dir / "rounds.parquet")["train_loss"]
    b = pd.read_parquet(again.run_dir / "rounds.parquet")["train_loss"]
    assert np.array_equal(a.to_numpy(), b.to_numpy())


def test_lock_step_falls_back_for_batch_norm_with_a_notice(tmp_path, capsys):
    fast = run(scenario("test_whole_bn", **{"execution.training.path": "lockstep"}),
               out=tmp_path / "v")
    err = capsys.readouterr().err
    assert err.count("raymm: notice: devices train sequentially") == 1, err
    assert "the model has buffers" in err
    slow = run(scenario("test_whole_bn", **{"execution.training.path": "sequential"}),
               out=tmp_path / "s")
    assert "notice" not in capsys.readouterr().err
    assert np.array_equal(fast.params["shared"], slow.params["shared"])


@pytest.mark.parametrize("factory, message", [
    ("nope", "unknown model factory 'nope'; registered:"),
    ("test_not_a_module", "returned Tensor, not a torch.nn.Module"),
    ("test_wrong_logits", "logits of shape [2, 5] for a batch of 2; expected [2, 4]"),
])
def test_validate_refuses_a_factory_that_does_not_fit(factory, message):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(scenario(factory))
    assert any(message in p for p in exc.value.problems), exc.value.problems


def test_validate_refuses_a_method_needing_parts_the_model_lacks():
    with pytest.raises(ScenarioError) as exc:
        load_scenario(scenario("test_whole_bn", method="tide"))
    text = "\n".join(exc.value.problems)
    assert "objective 'tide' needs a per-sensor encoder for every sensor" in text
    assert "which this whole model lacks" in text
    with pytest.raises(ScenarioError) as exc:
        load_scenario(scenario("test_whole_bn", **{"training.upload": "held"}))
    assert "training.upload: held needs a per-sensor encoder" in "\n".join(exc.value.problems)
    # parts are enough for pod-wise upload
    load_scenario(scenario("test_parts", **{"training.upload": "held"}))


def test_counting_flops_leaves_batch_norm_statistics_alone():
    from raymm.data import load_dataset
    from raymm.models.size import flops_per_sample

    sc = load_scenario(scenario("test_whole_bn"))
    ds = load_dataset(sc.dataset_name, sc.dataset_params(), 0)
    net = build_net(ds.sensors, {m: ds.sensor_shape(m) for m in ds.sensors}, ds.num_classes,
                    sc.model, seed=1)
    before = {n: b.clone() for n, b in net.named_buffers()}
    assert flops_per_sample(net, ds) > 0
    assert all(torch.equal(before[n], b) for n, b in net.named_buffers())


def test_local_buffers_stay_on_each_device(tmp_path):
    """model.buffers: local (FedBN): only parameters travel; every device keeps, trains and is
    evaluated with its own statistics; the global model keeps the initial ones."""
    sc = scenario("test_whole_bn", **{"model.buffers": "local", "eval.scope": "both",
                                      "population.local_test_fraction": 0.25})
    res = run(sc, out=tmp_path / "a")
    net = raymm.load_model(res.run_dir)
    bn = net.net.body[1]
    assert torch.equal(bn.running_mean, torch.zeros(16))  # the global model's: initial
    layout = GroupLayout(net, "local")
    assert "buffers" in layout.slots and "buffers" not in layout.groups
    assert not any(s.buffer for s in layout.slots["shared"])
    trained = pd.read_parquet(res.run_dir / "devices.parquet")
    devs = trained.loc[trained["times_selected"] > 0, "device"].tolist()[:2]
    mine = [raymm.load_model(res.run_dir, device=d).net.body[1].running_mean for d in devs]
    assert not torch.equal(mine[0], torch.zeros(16)) and not torch.equal(mine[0], mine[1])
    # the same numbers at another packing, and after a resume
    other = run(scenario("test_whole_bn", **{"model.buffers": "local", "eval.scope": "both",
                                              "population.local_test_fraction": 0.25,
                                              "execution.devices_per_actor": 5}),
                out=tmp_path / "b")
    assert np.array_equal(res.params["shared"], other.params["shared"])
    a = pd.read_parquet(res.run_dir / "rounds.parquet")
    b = pd.read_parquet(other.run_dir / "rounds.parquet")
    assert np.array_equal(a["accuracy"].to_numpy(), b["accuracy"].to_numpy(), equal_nan=True)


def test_local_buffers_resume_exactly(tmp_path):
    from helpers import resume_from_round_3

    sc = scenario("test_whole_bn", **{"model.buffers": "local", "rounds": 6,
                                      "output.checkpoint_every": 3, "eval.scope": "devices",
                                      "population.local_test_fraction": 0.25,
                                      "output.keep_checkpoints": 5})
    ref = run(sc, out=tmp_path / "ref")
    again = resume_from_round_3(tmp_path, ref)
    assert np.array_equal(ref.params["shared"], again.params["shared"])
    a = pd.read_parquet(ref.run_dir / "rounds.parquet")
    b = pd.read_parquet(again.run_dir / "rounds.parquet")
    assert np.array_equal(a["accuracy"].to_numpy(), b["accuracy"].to_numpy(), equal_nan=True)


@register_model("test_dropout")
def make_dropout(ctx: ModelContext) -> nn.Module:
    d = sum(int(np.prod(ctx.shapes[m])) for m in ctx.sensors)

    class Drop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(d, 16), nn.Dropout(0.3),
                                      nn.Linear(16, ctx.num_classes))

        def forward(self, xs: dict[str, torch.Tensor]) -> torch.Tensor:
            return self.body(torch.cat([xs[m].flatten(1) for m in ctx.sensors], dim=1))

    return Drop()


@pytest.mark.lockstep_fallback
def test_a_modules_own_randomness_is_seeded_per_device(tmp_path):
    """Dropout draws from torch's global generator: seeded per (seed, round, device), the
    numbers do not depend on packing, and lock-step (which cannot vmap random ops) falls back
    to the same numbers."""
    runs = [run(scenario("test_dropout", **extra), out=tmp_path / str(i))
            for i, extra in enumerate([{}, {"execution.devices_per_actor": 5},
                                       {"execution.training.path": "lockstep"}])]
    for other in runs[1:]:
        assert np.array_equal(runs[0].params["shared"], other.params["shared"])
    # lock-step is the default: every run's rows count the devices that fell back
    assert all(sum(r["lockstep_fallbacks"] for r in res.rows) > 0 for res in runs)


def test_a_network_that_cannot_be_built_for_the_data_is_refused_by_validate():
    """raymm's own network with ResNet encoders on vector inputs fails to build: validate says
    so (exit 2 from the CLI) instead of a traceback in the middle of a run."""
    with pytest.raises(ScenarioError) as exc:
        load_scenario(tiny_scenario(**{"model.encoder": "resnet18"}))
    assert any("factory 'multimodal' cannot build a model for inputs of shapes" in p and
               "resnet18 needs [H, W] or [C, H, W] inputs" in p for p in exc.value.problems)


def test_warming_a_host_up_leaves_a_batch_norm_model_alone():
    from raymm.device.warmup import warm_up

    from helpers import host_round

    _, host, _, _ = host_round({}, **{"model": {"factory": "test_whole_bn"}})
    before = {n: t.clone() for n, t in host.trainer.model.state_dict().items()}
    warm_up(host)
    after = host.trainer.model.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)
