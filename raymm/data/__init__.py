"""Datasets: the `Dataset` (in memory or memory-mapped, `raymm.data.mapped`), the loader
registry, and the built-in loaders.

Importing this package registers `digits`, `synthetic`, `synthetic_mmap`, `har`, `bench`,
`avdigits` and the prepared releases `crema_d`, `ave`, `cmu_mosei`. The releases, one module
each with its converter, download source and own loader, are in `raymm.data.releases`;
`prepare` and `download` run them.

May import: base, io.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from raymm.data import avdigits, digits, har, releases, synthetic, synthetic_mmap, workload  # noqa: F401  (import registers the loaders)
from raymm.data.base import (
    DATASETS,
    Dataset,
    Split,
    dataset_problems,
    loader_facts,
    register_dataset,
    resolve_data_path,
)
from raymm.errors import DataError

__all__ = [
    "DATASETS",
    "Dataset",
    "Split",
    "dataset_params",
    "dataset_sensors",
    "load_dataset",
    "register_dataset",
    "resolve_data_path",
]


def _loader(name: str):
    try:
        return DATASETS[name]
    except KeyError:
        known = ", ".join(sorted(DATASETS))
        raise KeyError(f"unknown dataset {name!r}; known: {known}") from None


def dataset_params(name: str, raw: dict[str, Any]) -> BaseModel:
    """Validate a scenario's dataset params (pydantic `ValidationError` on bad fields)."""
    return _loader(name).Params.model_validate(raw)


def dataset_sensors(name: str, raw: dict[str, Any]) -> tuple[str, ...]:
    """A dataset's sensors, answered from its params alone (no data is loaded)."""
    loader = _loader(name)
    return tuple(loader.sensors(loader.Params.model_validate(raw)))


def load_dataset(name: str, params: BaseModel | dict[str, Any], seed: int) -> Dataset:
    """Load `name`; the same params and seed give byte-identical arrays. A dataset that breaks
    the contract (`dataset_problems`: shapes, dtypes, labels) is a DataError naming each
    problem, before anything is built."""
    if isinstance(params, dict):
        params = dataset_params(name, params)
    loader = _loader(name)
    ds = loader.load(params, seed)
    problems = dataset_problems(ds, name, tuple(loader.sensors(params)),
                                loader_facts(loader, params))
    if problems:
        raise DataError("; ".join(problems))
    return ds
