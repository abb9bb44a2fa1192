"""The standard benchmark workload's data (docs/workload.md), pooled for raymm.

The bare loop generates each client's samples on demand; raymm devices hold index arrays into
one shared split, so this loader runs the same formulas once for every client and concatenates
them: client `c` owns rows `c*S .. (c+1)*S-1` and `Split.group` records it, so a
`partition: {kind: by_group}` population gives device `c` exactly the bare loop's client `c`.

Formulas (seeded by the scenario seed, as the bare loop's `--seed`): class means
`mu ~ N(0,1)^{C x D}` from `default_rng([seed, 0])`; client `c` from `default_rng([seed, 1, c])`
draws a label mix `Dir(alpha)`, `S` labels from it, and `x = mu[y] + N(0, noise^2)`; the test
set comes from `default_rng([seed, 2])` with uniform labels. One sensor, `x`, of shape `[D]`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raymm.data.base import DataFacts, Dataset, Split, register_dataset

SENSOR = "x"


class BenchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clients: int = Field(1000, ge=1, description="N: clients (one device each)")
    samples_per_client: int = Field(64, ge=1, description="S")
    dim: int = Field(64, ge=1, description="D: input features")
    classes: int = Field(6, ge=2, description="C")
    noise: float = Field(3.0, ge=0, description="feature noise std")
    alpha: float = Field(0.5, gt=0, description="Dirichlet alpha of each client's label mix")
    test_samples: int = Field(2000, ge=1)


def class_means(p: BenchParams, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 0]).normal(0.0, 1.0, size=(p.classes, p.dim)).astype(
        np.float32)


def client_data(p: BenchParams, seed: int, cid: int, mu: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Client `cid`'s samples, draw for draw as the bare loop's `client_data`."""
    rng = np.random.default_rng([seed, 1, cid])
    mix = rng.dirichlet(np.full(p.classes, p.alpha))
    y = rng.choice(p.classes, size=p.samples_per_client, p=mix)
    x = mu[y] + rng.normal(0.0, p.noise, size=(p.samples_per_client, p.dim)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


@register_dataset("bench")
class BenchLoader:
    """Loader for `dataset: {name: bench}`."""

    Params = BenchParams

    def sensors(self, params: BaseModel) -> tuple[str, ...]:
        return (SENSOR,)

    def required_files(self, params: BaseModel) -> list[Path]:
        return []

    def facts(self, params: BaseModel) -> DataFacts:
        assert isinstance(params, BenchParams)
        return DataFacts(params.clients * params.samples_per_client, params.clients,
                         {SENSOR: (params.dim,)}, params.classes)

    def load(self, params: BaseModel, seed: int) -> Dataset:
        assert isinstance(params, BenchParams)
        p = params
        mu = class_means(p, seed)
        x = np.empty((p.clients * p.samples_per_client, p.dim), np.float32)
        y = np.empty(p.clients * p.samples_per_client, np.int64)
        for c in range(p.clients):
            rows = slice(c * p.samples_per_client, (c + 1) * p.samples_per_client)
            x[rows], y[rows] = client_data(p, seed, c, mu)
        rng = np.random.default_rng([seed, 2])
        y_test = rng.integers(0, p.classes, size=p.test_samples)
        x_test = mu[y_test] + rng.normal(0.0, p.noise, size=(p.test_samples, p.dim)).astype(
            np.float32)
        return Dataset(
            name="bench", sensors=(SENSOR,), num_classes=p.classes,
            train=Split(x={SENSOR: x}, y=y,
                        group=np.repeat(np.arange(p.clients), p.samples_per_client)),
            test=Split(x={SENSOR: x_test.astype(np.float32)}, y=y_test.astype(np.int64)),
            class_names=tuple(str(c) for c in range(p.classes)),
            meta={"workload": "docs/workload.md"})
