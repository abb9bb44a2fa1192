"""Deterministic CUDA, checked without a GPU: the settings `choose_accelerator` makes when it
picks CUDA (torch's calls replaced by recorders, so this process stays as it was), where a
DeviceActor makes them, and the repeatability part of tools/gpu_check.py on the CPU."""

from __future__ import annotations

import ast
import logging

import pytest
import torch

from raymm.training import accelerator
from raymm.training.accelerator import (
    CUBLAS_WORKSPACE_CONFIG,
    choose_accelerator,
    deterministic_cuda,
)

from helpers import REPO, load_script


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


def test_device_actor_chooses_its_device_before_touching_cuda():
    """DeviceActor.setup picks the device (and with it deterministic mode) before it builds or
    warms up its host, and its constructor uses nothing of CUDA."""
    tree = ast.parse((REPO / "actors" / "device_actor.py").read_text())
    actor = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeviceActor")
    methods = {f.name: f for f in actor.body if isinstance(f, ast.FunctionDef)}

    def first_call(fn: ast.FunctionDef, name: str) -> int:
        lines = [c.lineno for c in ast.walk(fn) if isinstance(c, ast.Call)
                 and getattr(c.func, "id", getattr(c.func, "attr", None)) == name]
        assert lines, f"{fn.name} does not call {name}"
        return min(lines)

    setup = methods["setup"]
    assert first_call(setup, "choose_accelerator") < first_call(setup, "make_host")
    assert first_call(setup, "choose_accelerator") < first_call(setup, "warm_up")
    assert "cuda" not in ast.unparse(methods["__init__"])


def test_gpu_check_repeat_part_on_cpu(tmp_path, capsys):
    """gpu_check's repeatability part, on the CPU here: the same sha twice, and its sentence."""
    gpu_check = load_script(REPO / "tools" / "gpu_check.py")
    res = gpu_check.main(["--out", str(tmp_path), "--cpu-only", "--parts", "repeat",
                          "--repeat-rounds", "1"])
    rep = res["repeat"]
    assert rep["device"] == "cpu" and rep["same"]
    for mode in ("sequential", "lockstep"):
        a, b = rep["runs"][mode]["sha"]
        assert a == b and len(a) == 64
    out = capsys.readouterr().out
    assert "deterministic on CPU" in out and "same sha" in out
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.startswith("# GPU check") and "0. deterministic on CPU" in md
    assert not [line for line in md.splitlines() if line[:2] in ("1.", "2.", "3.")]  # asked: 0
    # the sentence when two runs differ names the difference and torch's warnings
    differ = {"same": False, "rounds": 3, "nondeterministic_ops":
              ["adaptive_avg_pool2d_backward_cuda does not have a deterministic implementation"],
              "runs": {"sequential": {"same": True, "sha": ["a" * 64] * 2},
                       "lockstep": {"same": False, "sha": ["b" * 64, "c" * 64],
                                      "max_abs_diff": 3e-8}}}
    line = gpu_check.repeat_line(differ, "NVIDIA H100")
    assert line.startswith("NOT deterministic on NVIDIA H100: sequential: same sha; "
                           "lockstep: bbbbbbbbbbbb vs cccccccccccc, largest difference 3e-08")
    assert "adaptive_avg_pool2d_backward_cuda" in line
