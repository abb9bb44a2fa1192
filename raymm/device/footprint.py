"""What a host (a DeviceActor on Ray) holds in memory, estimated before anything is loaded.

The estimate is made from the scenario alone, through the loader's `DataFacts` (sizes and
shapes) and the model built on torch's meta device, so the Ray executor can ask Ray for each
actor's memory and refuse a packing that cannot fit before the first actor starts. It counts:

- `base`: a process with torch, raymm and Ray imported and a host built, measured per actor
  (`ACTOR_BASE_MIB`; `tools/actor_memory.py` measures it again);
- the model's float32 parameters (`model_bytes`) times the copies every host keeps: the module
  itself, its gradients, the initial vectors every device starts from, the round's broadcast,
  and the optimizer's state (one for SGD with momentum, two for Adam);
- one more copy per device selected there in a round: its trained vector, until it is sent;
- what each device keeps between rounds (`training.exchange`): nothing for `params`, its own
  parameters for `none` and `personal`, its parameters and its base for `delta`; counted for
  every device the host holds, since in a long run each is selected at some point;
- its devices' training rows, float32 inputs of every sensor plus the label. A dataset held in
  memory is shared (Ray's object store, mapped by every process) but each host reads its own
  devices' rows, which then count in its resident memory. A memory-mapped dataset
  (`raymm.data.mapped`) is not resident: a host lets go of each round's pages, so only the rows
  of one round's selected devices count.

Not counted: a policy's own per-device state (SCAFFOLD's control variates: one more model per
device; FedProto's prototypes), extra copies in a lock-step program (`execution.training.path`,
bounded by its `chunk`), and anything a plugin's model allocates beyond its parameters.
The estimate is a request, not a limit: Ray uses it to place actors, the kernel does not
enforce it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from raymm.config.schema import Scenario
from raymm.data import DATASETS
from raymm.data.base import DataFacts, loader_facts
from raymm.models.factory import ModelContext, build_from_factory

MIB = 2**20
#: a DeviceActor's proportional set size (PSS) with torch, raymm and Ray loaded and a host of a
#: tiny model built and warmed up (measured: docs/cluster.md, "Sizing a cluster")
ACTOR_BASE_MIB = 420
#: float32 inputs; labels are int64
INPUT_BYTES, LABEL_BYTES = 4, 8
KEPT = {"params": 0, "none": 1, "personal": 1, "delta": 2}


@dataclass(frozen=True)
class Footprint:
    """The numbers a host's memory estimate is made of (bytes, counts)."""

    base: int
    model_bytes: int
    fixed_copies: int      # copies of the model every host keeps
    kept_copies: int       # copies each device keeps between rounds
    row_bytes: int         # one training row: every sensor's input and the label
    rows_per_device: float
    selected_share: float  # devices selected per round / devices
    mapped: bool

    def selected(self, devices: int) -> int:
        """Devices of a host of `devices` selected in a round (expected, rounded up)."""
        return min(devices, math.ceil(self.selected_share * devices))

    def parts(self, devices: int) -> dict[str, int]:
        """Bytes per part for a host of `devices`."""
        rows = self.selected(devices) if self.mapped else devices
        return {"base": self.base,
                "model copies": self.model_bytes * (self.fixed_copies + self.selected(devices)),
                "device states": self.model_bytes * self.kept_copies * devices,
                "data rows": int(self.row_bytes * self.rows_per_device * rows)}

    def bytes(self, devices: int) -> int:
        return sum(self.parts(devices).values())

    def describe(self, devices: int) -> str:
        """`1.2 GiB: base 330 MiB, model 4.1 MiB x 6 copies, 250 device states 2.0 GiB, ...`"""
        rows = self.selected(devices) if self.mapped else devices
        copies = self.fixed_copies + self.selected(devices)
        kept = self.model_bytes * self.kept_copies * devices
        text = (f"{gib(self.bytes(devices))} for {devices} device(s): base {gib(self.base)}, "
                f"model {gib(self.model_bytes)} x {copies} copies")
        if kept:
            text += f", {devices} device states {gib(kept)}"
        what = "mapped rows of one round" if self.mapped else "data rows"
        return (text + f", {round(self.rows_per_device * rows):,} {what} "
                       f"{gib(self.parts(devices)['data rows'])}")


def gib(n: float) -> str:
    """Bytes as KiB below a MiB, MiB below a GiB, else GiB."""
    if n < MIB:
        return f"{n / 1024:.0f} KiB"
    return f"{n / MIB:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def footprint(sc: Scenario, base_mib: float = ACTOR_BASE_MIB) -> Footprint | None:
    """The scenario's per-host footprint; None when the loader cannot tell its sizes without
    loading (no `facts`)."""
    loader = DATASETS.get(sc.dataset_name)
    if loader is None:
        return None
    params = loader.Params(**sc.dataset_params())
    facts = loader_facts(loader, params)
    if facts is None:
        return None
    tr = sc.training
    optimizer = 2 if tr.optimizer == "adam" else int(tr.momentum > 0)
    n = sc.population.devices
    return Footprint(
        base=int(base_mib * MIB), model_bytes=4 * parameter_count(sc, facts),
        fixed_copies=4 + optimizer, kept_copies=KEPT[tr.exchange],
        row_bytes=row_bytes(facts), rows_per_device=facts.n_train / n,
        selected_share=min(1.0, sc.selection.k / n),
        mapped=bool(getattr(params, "mmap", False)))


def row_bytes(facts: DataFacts) -> int:
    return LABEL_BYTES + INPUT_BYTES * sum(math.prod(s) for s in facts.shapes.values())


def parameter_count(sc: Scenario, facts: DataFacts) -> int:
    """Parameters of the scenario's model, built on the meta device (no memory)."""
    sensors = tuple(facts.shapes)
    ctx = ModelContext(sensors, {m: tuple(facts.shapes[m]) for m in sensors},
                       facts.num_classes, sc.model)
    with torch.device("meta"):
        net = build_from_factory(ctx)
    return sum(p.numel() for p in net.parameters())
