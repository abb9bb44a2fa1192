"""A synthetic multimodal generator: fast, download-free data with a controllable signal per
sensor, so tests can make one modality dominant and another pure noise.

Each sensor draws from its own generator seeded by `[seed, crc32(name)]`, so adding or
removing a sensor leaves the others' arrays unchanged.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from raymm.data.base import DataFacts, Dataset, Split, register_dataset

_LABELS_KEY = "__labels__"
_GROUPS_KEY = "__groups__"


class SensorSpec(BaseModel):
    """`informativeness` is the std of the class means (per feature) in units of the unit
    Gaussian noise; 0 makes the sensor pure noise. `length` turns samples into `[length, dim]`
    time series whose class signal is a per-class sinusoid."""

    model_config = ConfigDict(extra="forbid")
    dim: int = Field(ge=1)
    informativeness: float = Field(ge=0.0)
    length: int | None = Field(default=None, ge=1)


def _default_sensors() -> dict[str, SensorSpec]:
    return {
        "a": SensorSpec(dim=16, informativeness=1.0),
        "b": SensorSpec(dim=16, informativeness=0.3),
    }


def _rng(seed: int, key: str) -> np.random.Generator:
    """Stable across processes (crc32, never Python's salted `hash()`)."""
    return np.random.default_rng([seed, zlib.crc32(key.encode("utf-8"))])


def _labels(rng: np.random.Generator, n: int, classes: int) -> np.ndarray:
    """Balanced labels (counts differ by at most one), shuffled."""
    return rng.permutation(np.arange(n, dtype=np.int64) % classes)


def _class_signal(rng: np.random.Generator, spec: SensorSpec, classes: int) -> np.ndarray:
    """Per-class mean: `[classes, dim]`, or `[classes, length, dim]` sinusoids of RMS
    `informativeness` with a random frequency (1..4 cycles per window) and phase per channel."""
    if spec.length is None:
        return spec.informativeness * rng.standard_normal((classes, spec.dim))
    freq = rng.uniform(1.0, 4.0, size=(classes, 1, spec.dim))
    phase = rng.uniform(0.0, 2 * np.pi, size=(classes, 1, spec.dim))
    t = np.arange(spec.length, dtype=np.float64)[None, :, None] / spec.length
    return spec.informativeness * np.sqrt(2.0) * np.sin(2 * np.pi * freq * t + phase)


#: samples generated per step: float64 noise for a chunk, never for the whole split (10M
#: samples x 12 features would be three ~1 GB float64 temporaries)
CHUNK = 1 << 16


def _sensor_split(rng: np.random.Generator, signal: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 `signal[y] + N(0, 1)`, drawn in chunks of `CHUNK` samples: consecutive draws of
    one generator give the very numbers one whole-split draw gives."""
    out = np.empty((y.size, *signal.shape[1:]), dtype=np.float32)
    for lo in range(0, y.size, CHUNK):
        hi = min(lo + CHUNK, y.size)
        noise = rng.standard_normal((hi - lo, *signal.shape[1:]))
        noise += signal[y[lo:hi]]
        out[lo:hi] = noise
    return out


def group_labels(y: np.ndarray, group: np.ndarray, classes: int, groups: int) -> np.ndarray:
    """The label group g gives class y: (y + g·⌊classes/groups⌋) mod classes. Every group
    pair disagrees on every class (the shifts differ by less than `classes`), so a model fit
    to one group is wrong on every sample of another: updates conflict by construction."""
    return ((y + group * (classes // groups)) % classes).astype(np.int64)


@register_dataset("synthetic")
class SyntheticLoader:
    """Loader for `dataset: {name: synthetic}`."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        classes: int = Field(6, ge=2)
        n_train: int = Field(2000, ge=1)
        n_test: int = Field(500, ge=1)
        sensors: dict[str, SensorSpec] = Field(default_factory=_default_sensors, min_length=1)
        #: G label groups whose updates conflict by construction: every sample is drawn into
        #: a group g (uniformly, seeded) and labelled with its class shifted by g·⌊classes/G⌋
        #: (mod classes), so the same inputs mean a different class in every group; `Split.group`
        #: holds g (`population.partition.kind: grouped` gives each device one group's
        #: samples). 1: no groups, the arrays of a scenario without the key
        groups: int = Field(1, ge=1)

        @model_validator(mode="after")
        def _check_groups(self) -> SyntheticLoader.Params:
            if self.groups > self.classes:
                raise ValueError(f"groups: {self.groups} label groups need at least as many "
                                 f"classes (got {self.classes}): a group's label shift "
                                 "g·⌊classes/groups⌋ must differ for every group")
            return self

    def sensors(self, params: BaseModel) -> tuple[str, ...]:
        assert isinstance(params, self.Params)
        return tuple(params.sensors)

    def required_files(self, params: BaseModel) -> list[Path]:
        return []

    def facts(self, params: BaseModel) -> DataFacts:
        assert isinstance(params, self.Params)
        return DataFacts(params.n_train, params.groups if params.groups > 1 else None, {
            m: (s.dim,) if s.length is None else (s.length, s.dim)
            for m, s in params.sensors.items()}, params.classes)

    def load(self, params: BaseModel, seed: int) -> Dataset:
        assert isinstance(params, self.Params)
        lab = _rng(seed, _LABELS_KEY)
        y_train = _labels(lab, params.n_train, params.classes)
        y_test = _labels(lab, params.n_test, params.classes)
        x_train: dict[str, np.ndarray] = {}
        x_test: dict[str, np.ndarray] = {}
        for name, spec in params.sensors.items():
            rng = _rng(seed, name)
            signal = _class_signal(rng, spec, params.classes)
            x_train[name] = _sensor_split(rng, signal, y_train)
            x_test[name] = _sensor_split(rng, signal, y_test)
        g_train = g_test = None
        if params.groups > 1:  # its own stream: the inputs above are those of groups: 1
            grp = _rng(seed, _GROUPS_KEY)
            g_train = grp.integers(0, params.groups, params.n_train)
            g_test = grp.integers(0, params.groups, params.n_test)
            y_train = group_labels(y_train, g_train, params.classes, params.groups)
            y_test = group_labels(y_test, g_test, params.classes, params.groups)
        return Dataset(
            name="synthetic",
            sensors=tuple(params.sensors),
            num_classes=params.classes,
            train=Split(x=x_train, y=y_train, group=g_train),
            test=Split(x=x_test, y=y_test, group=g_test),
            class_names=tuple(str(c) for c in range(params.classes)),
            meta={"informativeness": {k: s.informativeness for k, s in params.sensors.items()}},
        )
