"""The accelerator (raymm.training.accelerator): which torch device a host trains on
(`execution.accelerator`) and when CUDA is refused; and the deterministic CUDA settings
`choose_accelerator` makes when it picks CUDA, checked without a GPU (torch's calls replaced
by recorders, so this process stays as it was)."""

from __future__ import annotations

import logging

import pytest
import torch

from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.errors import ScenarioError
from raymm.training import accelerator
from raymm.training.accelerator import (
    CUBLAS_WORKSPACE_CONFIG,
    DeviceUnavailable,
    choose_accelerator,
    deterministic_cuda,
)

from helpers import tiny_scenario


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch as if it had a GPU; the deterministic switches recorded instead of set."""
    calls: list[tuple[bool, bool]] = []
    state = {"on": False, "warn_only": False}

    def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
        calls.append((mode, warn_only))
        state.update(on=mode, warn_only=warn_only)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", use_deterministic_algorithms)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: state["on"])
    monkeypatch.setattr(torch, "is_deterministic_algorithms_warn_only_enabled",
                        lambda: state["warn_only"])
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    return calls


def test_choosing_cuda_switches_on_deterministic_mode(fake_cuda, monkeypatch):
    assert choose_accelerator("auto", True) == ("cuda", None)
    assert fake_cuda == [(True, True)]
    import os

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE_CONFIG == ":4096:8"
    assert torch.backends.cudnn.benchmark is False
    assert torch.backends.cudnn.deterministic is True
    # a DeviceActor with a GPU from Ray, and `cuda` asked for: the same settings
    assert choose_accelerator("cuda", True, ["0"]) == ("cuda", None)
    assert fake_cuda == [(True, True)] * 2


def test_cpu_choices_change_nothing(fake_cuda, monkeypatch):
    import os

    assert choose_accelerator("cpu", True) == ("cpu", None)
    assert choose_accelerator("auto", True, []) == ("cpu", None)     # an actor without a GPU
    assert choose_accelerator("auto", False, ["0"])[0] == "cpu"      # Ray's GPU, torch sees none
    assert fake_cuda == [] and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert torch.backends.cudnn.benchmark is True


def test_without_cuda_in_torch_nothing_is_set(monkeypatch):
    """On this CPU machine a caller may still say `cuda_available=True` (the device tests do):
    the process's torch is only changed when torch really has CUDA."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch, "use_deterministic_algorithms",
                        lambda *a, **k: calls.append(a))
    assert choose_accelerator("auto", True) == ("cuda", None)
    assert calls == []


def test_workspace_setting_kept_or_replaced(fake_cuda, monkeypatch, caplog):
    import os

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")       # NVIDIA's other valid value
    assert deterministic_cuda()["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    settings = deterministic_cuda()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert settings == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "deterministic_algorithms": True,
                        "warn_only": True, "cudnn.benchmark": False, "cudnn.deterministic": True}
    # CUDA already in use before raymm could set the workspace: said, not hidden
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with caplog.at_level(logging.WARNING, logger=accelerator.log.name):
        deterministic_cuda()
    assert "CUDA was in use before raymm set CUBLAS_WORKSPACE_CONFIG" in caplog.text


def test_device_choice():
    assert choose_accelerator("auto", True) == ("cuda", None)          # serial, GPU present
    assert choose_accelerator("auto", False) == ("cpu", None)
    assert choose_accelerator("cpu", True, ["0"]) == ("cpu", None)     # asked for the CPU
    assert choose_accelerator("auto", True, []) == ("cpu", None)       # actor without a GPU
    assert choose_accelerator("auto", True, ["1"]) == ("cuda", None)
    device, why = choose_accelerator("auto", False, ["0"])   # fake GPUs, or a CPU-only torch
    assert device == "cpu" and "no CUDA" in why and "0" in why
    assert choose_accelerator("cuda", True, ["0"]) == ("cuda", None)
    with pytest.raises(DeviceUnavailable, match="torch sees no CUDA"):
        choose_accelerator("cuda", False)
    with pytest.raises(DeviceUnavailable, match="num_gpus"):
        choose_accelerator("cuda", True, [])


def test_cuda_on_ray_without_gpus_is_a_scenario_error():
    with pytest.raises(ScenarioError, match="execution.accelerator: cuda needs GPUs"):
        load_scenario(tiny_scenario(**{"execution.executor": "ray",
                                       "execution.accelerator": "cuda"}))
    load_scenario(tiny_scenario(**{"execution.executor": "ray", "execution.accelerator": "cuda",
                                   "execution.actor.num_gpus": 0.25}))


def test_serial_cuda_without_a_gpu_stops_before_training(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailable, match="torch sees no CUDA"):
        run(load_scenario(tiny_scenario(**{"execution.accelerator": "cuda"})), out=tmp_path)
    assert not any(tmp_path.rglob("rounds.parquet"))
