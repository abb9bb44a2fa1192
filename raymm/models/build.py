"""Building the network every process starts from: the same initial weights everywhere,
built by the scenario's model factory under a fixed torch seed from the dataset's sensors,
shapes and classes.
"""

from __future__ import annotations

import torch

from raymm import seeding
from raymm.config.schema import ModelSpec
from raymm.data.base import Dataset
from raymm.models.factory import ModelContext, build_from_factory
from raymm.models.network import RaymmNet


def build_model(dataset: Dataset, spec: ModelSpec, seed: int) -> RaymmNet:
    """The same initial weights in every process: built under a fixed torch seed."""
    return build_net(dataset.sensors, {m: dataset.sensor_shape(m) for m in dataset.sensors},
                     dataset.num_classes, spec, seed)


def build_net(sensors: tuple[str, ...], shapes: dict[str, tuple[int, ...]], num_classes: int,
              spec: ModelSpec, seed: int) -> RaymmNet:
    """`build_model` from the dataset's shapes alone (`raymm.load_model` has no dataset)."""
    ctx = ModelContext(tuple(sensors), dict(shapes), int(num_classes), spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeding.torch_seed(seed, seeding.SETUP, seeding.SERVER, "model"))
        return build_from_factory(ctx)
