"""SCAFFOLD's device side (policies.objective.scaffold): the control-variate update (option II),
the loss correction, and what a periodic sync sends."""

from __future__ import annotations

import numpy as np
import torch

from policies.objective.scaffold import ScaffoldObjective, ScaffoldParams
from raymm.models.layout import Slot
from raymm.protocol.seams import DeviceFinish


def test_device_control_variate_option_ii() -> None:
    obj = ScaffoldObjective(ScaffoldParams(variate="displacement"))
    fin = DeviceFinish(device=0, round=2, groups=("g",), start={"g": np.array([1.0, 2.0])},
                       end={"g": np.array([0.5, 2.5])},
                       state={"scaffold_ci/g": np.array([0.1, 0.0])},
                       extras={"scaffold_c/g": np.array([0.2, -0.2])}, steps=5, lr=0.1)
    state, sent = obj.device_finish(fin)
    # c_i+ = c_i - c + (x - y)/(K·lr) = [0.1-0.2+1, 0+0.2-1] = [0.9, -0.8]
    np.testing.assert_allclose(state["scaffold_ci/g"], [0.9, -0.8], rtol=1e-6)
    np.testing.assert_allclose(sent["scaffold_dc/g"], [0.8, -0.8], rtol=1e-6)


def test_gradient_variate_equals_option_ii_under_sgd() -> None:
    # 2 SGD steps (lr 0.1) with raw gradients g1, g2 and correction c - c_i
    c, ci = np.array([0.2, -0.2]), np.array([0.1, 0.0])
    g1, g2 = np.array([1.0, 0.0]), np.array([0.0, 3.0])
    x = np.array([1.0, 2.0])
    y = x - 0.1 * (g1 + c - ci) - 0.1 * (g2 + c - ci)
    common = dict(device=0, round=1, groups=("g",), start={"g": x}, end={"g": y},
                  state={"scaffold_ci/g": ci}, extras={"scaffold_c/g": c}, steps=2, lr=0.1)
    opt2, _ = ScaffoldObjective(ScaffoldParams(variate="displacement")).device_finish(
        DeviceFinish(**common))
    grads, _ = ScaffoldObjective().device_finish(DeviceFinish(
        **common, grad_mean={"g": (g1 + g2) / 2 + (c - ci)}))   # what the trainer sees
    np.testing.assert_allclose(opt2["scaffold_ci/g"], [0.5, 1.5], rtol=1e-6)
    np.testing.assert_allclose(grads["scaffold_ci/g"], [0.5, 1.5], rtol=1e-6)


def test_correction_term_has_gradient_c_minus_ci() -> None:
    obj = ScaffoldObjective(None)
    layout = type("L", (), {"sizes": {"g": 3}, "slots": {"g": [Slot("w", (3,), 0, 3)]}})()
    corr = obj.device_tensors({"scaffold_ci/g": np.array([1.0, 0.0, 0.0], np.float32)},
                              {"scaffold_c/g": np.array([0.0, 2.0, 0.0], np.float32)},
                              layout, ["g"])
    w = torch.zeros(3, requires_grad=True)
    (w * corr["w"]).sum().backward()
    torch.testing.assert_close(w.grad, torch.tensor([-1.0, 2.0, 0.0]))


def test_periodic_sync_sends_the_whole_change_since_the_last_report() -> None:
    """Between syncs Δc_i is dropped on the way; what arrives at the sync is every change since
    the last report, so the server's c moves by exactly c_i(now) - c_i(reported)."""
    obj = ScaffoldObjective()
    state: dict[str, np.ndarray] = {"scaffold_ci/g": np.array([1.0, 1.0], np.float32)}
    arrived = []
    # with c = 0 the trainer's mean gradient is raw - c_i, so c_i⁺ = raw = grad_mean + c_i:
    # these make c_i go 1 -> 2,0 -> 4,4 -> 3,1 -> 5,5
    for rnd, (grad, upload) in enumerate([([1.0, -1.0], False), ([2.0, 4.0], False),
                                          ([-1.0, -3.0], True), ([2.0, 4.0], True)], 1):
        new_state, sent = obj.device_finish(DeviceFinish(
            device=0, round=rnd, groups=("g",), start={"g": np.zeros(2)}, end={"g": np.zeros(2)},
            state=state, extras={}, steps=1, lr=0.1, grad_mean={"g": np.array(grad)},
            upload=upload))
        state = {**state, **new_state}                 # how hosts merge device state
        if upload:
            arrived.append(sent["scaffold_dc/g"])
    # syncs send 3,1 - 1,1 (the two dropped changes included) and then 5,5 - 3,1
    np.testing.assert_allclose(arrived[0], [2.0, 0.0])
    np.testing.assert_allclose(arrived[1], [2.0, 4.0])
    np.testing.assert_allclose(state["scaffold_ci_sent/g"], [5.0, 5.0])
