"""A lock-step program's plain data (raymm.training.lockstep.program): what a trained chunk
and a planned program answer about their devices."""

from __future__ import annotations

import numpy as np
import torch

from raymm.training.lockstep.program import ChunkRun, Program, Request


def _requests() -> list[Request]:
    held = np.array([True, False])
    return [Request(7, np.arange(5), held, ("shared",), None),
            Request(3, np.arange(10, 12), held, ("shared",), None)]


def test_a_chunk_run_names_its_devices_in_its_own_order() -> None:
    reqs = _requests()
    run = ChunkRun(reqs, [{}, {}], ["shared"], {"shared": np.zeros((2, 4), np.float32)},
                   np.zeros(2), np.array([3, 1]), None)
    devices = run.devices()
    assert devices.tolist() == [7, 3] and devices.dtype == np.int64


def test_a_program_gives_each_devices_samples_and_the_longest_devices_steps() -> None:
    reqs = _requests()
    empty: dict[str, torch.Tensor] = {}
    p = Program(reqs, 1, ["shared"], [], [{}, {}], empty, empty, empty, empty, empty,
                np.array([[True, False]] * 2), [("a",), ("a",)], torch.ones(2, 2), ("a",), {},
                np.array([5, 2]), np.array([3, 1]), [2, 1, 1], {})
    assert [i.tolist() for i in p.indices] == [[0, 1, 2, 3, 4], [10, 11]]
    assert p.steps == 3 and isinstance(p.steps, int)
