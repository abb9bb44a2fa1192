"""Encoders of a lock-step program run only for the devices that need them.

In a program that mixes sensor sets (`Objective.mixes_sensor_sets`: TIDE on UCI-HAR mixes
devices with both sensors, the accelerometer only and the gyroscope only), a sensor a device
lacks is an all-zero input, and its encoder's gradient is dropped for that device
(`LockstepTrainer._keeps`): the device's encoder weights stay as they started all round, so
its embedding of that sensor is one vector, the encoder of a zero sample, whatever the
minibatch. Running the encoder on a whole batch of zeros for such a device, forward and
backward, is wasted work, and in TIDE's HAR scenario a large share of a program's
device-sensor pairs lack the sensor (docs/performance.md, "Programs that mix sensor sets").

`SensorEncoders` computes each sensor's embeddings outside the model: the devices that hold
the sensor (or train its encoder) run it on their minibatch, in one call for all of them
(`lockstep_encoder.encode_devices`); the others run it on a single zero sample without
gradient, broadcast over the batch. The model then takes
those embeddings instead of running its encoders (`RaymmNet.takes_embeddings`). The same
numbers up to float32 rounding (a zero sample's embedding is computed in a call of another
batch size); a device's numbers still do not depend on which devices share its program, since
each device's encoder runs in a call whose kernel does not depend on that (`lockstep_conv`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

import numpy as np
import torch
from torch import Tensor, nn

from raymm.models import RaymmNet
from raymm.training._kernels.lockstep_conv import select_devices
from raymm.training._kernels.lockstep_encoder import encode_devices
from raymm.training._kernels.module_call import ModuleCall
from raymm.training.local_update import Params


class SensorEncoders:
    """Per sensor whose encoder some device of the program neither holds nor trains: which
    devices run it on their data (`full`), and the encoder's parameter names."""

    def __init__(self, call: ModuleCall, model: RaymmNet, sensors: tuple[str, ...],
                 helds: np.ndarray, trained: list[str], keeps: Mapping[str, Tensor],
                 accelerator: torch.device) -> None:
        self.call, self.accelerator = call, accelerator
        encoders = model.encoders
        assert isinstance(encoders, nn.ModuleDict)   # `takes_embeddings` promises them
        self.encoders = encoders
        self.plan: dict[str, tuple[list[str], np.ndarray]] = {}
        #: parameters whose `keeps` mask this makes redundant
        self.unmasked: set[str] = set()
        stacked = set(trained)
        for j, m in enumerate(sensors):
            prefix = f"encoders.{m}."
            names = [n for n, _ in model.named_parameters() if n.startswith(prefix)]
            # every weight of the encoder trained (stacked per device), none of them buffers
            if not names or not stacked.issuperset(names) or \
                    any(True for _ in encoders[m].buffers()):
                continue
            keep = keeps.get(names[0])
            trains = keep.cpu().numpy() if keep is not None else np.ones(len(helds), bool)
            full = helds[:, j] | trains
            if not full.all():
                self.plan[m] = (names, full)
                if not (full & ~trains).any():
                    # the devices that do not train it are those that do not run it here,
                    # whose gradient is then zero already: no mask to apply
                    self.unmasked.update(names)
        self._constants: dict[str, Tensor] = {}
        #: per prefix size k: sensor -> (rows that run it, rows that do not, their order back)
        self._rows: dict[int, dict[str, tuple[Tensor, Tensor, Tensor | None]]] = {}

    def embeddings(self, params: Params, x: Mapping[str, Tensor], k: int) -> dict[str, Tensor]:
        """sensor -> [k, B, E] embeddings of the first k devices, for the planned sensors."""
        out = {}
        for m, (full, lack, back) in self._rows_of(k).items():
            names = self.plan[m][0]
            xm = x[m]
            parts = []
            if full.numel():
                parts.append(self._encode(m, {n: params[n].index_select(0, full) for n in names},
                                          select_devices(xm, full)))
            if lack.numel():
                # the program's lacking devices in order: those of the first k come first
                const = self._constant(m, params, xm)[:lack.numel()]
                parts.append(const.expand(-1, xm.shape[1], *const.shape[2:]))
            emb = parts[0] if len(parts) == 1 else torch.cat(parts)
            out[m] = emb if back is None else emb.index_select(0, back)
        return out

    def zero_grads(self, grads: MutableMapping[str, Tensor | None], params: Params) -> None:
        """A planned encoder no device of a step runs gets zero gradients, not none: as when
        every device's gradient of it is dropped, the optimizer still counts the step."""
        for names, _ in self.plan.values():
            for n in names:
                if grads.get(n) is None:
                    grads[n] = torch.zeros_like(params[n])

    def _constant(self, m: str, params: Params, x: Tensor) -> Tensor:
        """[L, 1, E]: the embedding of a zero sample of every device of the program that
        lacks sensor m, in order; computed once, as those devices' weights of it never move."""
        if m not in self._constants:
            names, full = self.plan[m]
            lack = torch.from_numpy(np.flatnonzero(~full)).to(self.accelerator)
            # a program's first step is every device's (each has at least one minibatch)
            assert params[names[0]].shape[0] == full.shape[0]
            zero = x.new_zeros((lack.numel(), 1) + tuple(x.shape[2:]))
            with torch.no_grad():
                self._constants[m] = self._encode(
                    m, {n: params[n].index_select(0, lack) for n in names}, zero)
        return self._constants[m]

    def _encode(self, m: str, params: Params, x: Tensor) -> Tensor:
        return encode_devices(self.call, self.encoders[m], params, x)

    def _rows_of(self, k: int) -> dict[str, tuple[Tensor, Tensor, Tensor | None]]:
        if k not in self._rows:
            rows = {}
            for m, (_, full) in self.plan.items():
                f = full[:k]
                if f.all():
                    continue   # every device of this step runs it: the model does
                order = np.argsort(~f, kind="stable")   # those that run it, then the others
                back = np.argsort(order)
                runs = int(f.sum())
                dev = self.accelerator
                rows[m] = (torch.from_numpy(order[:runs]).to(dev),
                           torch.from_numpy(order[runs:]).to(dev),
                           None if (back == np.arange(k)).all() else
                           torch.from_numpy(back).to(dev))
            self._rows[k] = rows
        return self._rows[k]
