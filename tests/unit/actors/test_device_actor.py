"""DeviceActor (actors.device_actor), read from its source: setup picks the device (and with it
deterministic mode) before it builds or warms up its host; the constructor uses nothing of
CUDA."""

from __future__ import annotations

import ast

from helpers import REPO


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
