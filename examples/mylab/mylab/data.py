"""A dataset loader: two wearable sensors of a lab's own study, here simulated as Gaussian
class blobs so the example needs no file (a loader of recordings reads them in `load`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raymm.data.base import DataFacts, Dataset, Split, register_dataset


class BlobsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: training samples (devices partition these)
    n_train: int = Field(default=600, ge=1)
    #: test samples (the global model's pooled test split)
    n_test: int = Field(default=200, ge=1)
    classes: int = Field(default=3, ge=2)
    #: features per sample of the wrist accelerometer
    accel_dim: int = Field(default=6, ge=1)
    #: features per sample of the microphone
    mic_dim: int = Field(default=10, ge=1)
    #: distance between class means, in noise standard deviations (the microphone's is half)
    separation: float = Field(default=1.0, ge=0)


@register_dataset("mylab_blobs")
class Blobs:
    """Wrist accelerometer and microphone features of a simulated study: one Gaussian blob
    per class and sensor."""

    Params = BlobsParams

    def sensors(self, params: BlobsParams) -> tuple[str, ...]:
        return ("accel", "mic")

    def required_files(self, params: BlobsParams) -> list[Path]:
        return []  # generated: no file for `raymm validate` to look for

    def facts(self, params: BlobsParams) -> DataFacts:
        shapes = {"accel": (params.accel_dim,), "mic": (params.mic_dim,)}
        return DataFacts(params.n_train, None, shapes, params.classes)

    def load(self, params: BlobsParams, seed: int) -> Dataset:
        rng = np.random.default_rng([seed, 7321])  # same seed, same arrays, in any process
        dims = {"accel": params.accel_dim, "mic": params.mic_dim}
        scale = {"accel": params.separation, "mic": params.separation / 2}
        means = {m: scale[m] * rng.standard_normal((params.classes, d)) for m, d in dims.items()}

        def split(n: int) -> Split:
            y = rng.integers(0, params.classes, size=n)
            x = {m: (means[m][y] + rng.standard_normal((n, d))).astype(np.float32)
                 for m, d in dims.items()}
            return Split(x=x, y=y.astype(np.int64))

        train, test = split(params.n_train), split(params.n_test)
        return Dataset(name="mylab_blobs", sensors=("accel", "mic"),
                       num_classes=params.classes, train=train, test=test,
                       class_names=tuple(f"activity {c}" for c in range(params.classes)))
