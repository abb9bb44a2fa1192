"""Numbers a scenario may ask for: finite, inside int64, below the sizes this
simulator can hold, numbers where numbers belong, and shares that add up to one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

INT64 = (-(2**63), 2**63 - 1)

#: upper bounds of integer fields whose size turns into memory or time (path -> bound)
INT_BOUNDS: dict[tuple[str, ...], int] = {
    ("rounds",): 10_000_000,
    ("population", "devices"): 5_000_000,
    ("dataset", "classes"): 100_000,
    ("selection", "k"): 5_000_000,
    ("training", "local_epochs"): 10_000,
    ("training", "batch_size"): 10_000_000,
    ("execution", "training", "threads"): 1024,
    ("execution", "training", "chunk"): 1_000_000,
    ("training", "sync_every"): 10_000_000,
    ("model", "embed_dim"): 65_536,
    ("model", "hidden"): 65_536,
    ("model", "fusion_dim"): 65_536,
    ("model", "attention_heads"): 1024,
    ("model", "attention_hidden"): 65_536,
    ("eval", "every"): 10_000_000,
    ("eval", "batch_size"): 10_000_000,
    ("output", "checkpoint_every"): 10_000_000,
    ("output", "keep_checkpoints"): 1000,
    ("execution", "local_num_cpus"): 100_000,
    ("execution", "actor", "max_restarts"): 1000,
}
MAX_DATA_VALUES = 1 << 30




def value_problems(raw: Any, path: tuple[Any, ...] = ()) -> list[str]:
    """Non-finite floats and integers outside int64 anywhere in a (raw) scenario."""
    out: list[str] = []
    where = ".".join(map(str, path)) or "(top level)"
    if isinstance(raw, bool) or raw is None or isinstance(raw, str):
        return out
    if isinstance(raw, float) and not math.isfinite(raw):
        out.append(f"{where}: must be a finite number (got {raw})")
    elif isinstance(raw, int) and not INT64[0] <= raw <= INT64[1]:
        out.append(f"{where}: integer out of range (at most {INT64[1]} in magnitude)")
    elif isinstance(raw, Mapping):
        for k, v in raw.items():
            out += value_problems(v, (*path, k))
    elif isinstance(raw, list):
        for i, v in enumerate(raw):
            out += value_problems(v, (*path, i))
    return out


def bound_problems(raw: Mapping[str, Any]) -> list[str]:
    """Integer fields above the sizes this simulator can hold (INT_BOUNDS)."""
    out = []
    for path, bound in INT_BOUNDS.items():
        node: Any = raw
        for p in path:
            node = node.get(p) if isinstance(node, Mapping) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool) and \
                math.isfinite(node) and node > bound:
            out.append(f"{'.'.join(path)}: {node:g} is more than this simulator allows "
                       f"({bound:,})")
    return out


def _admits(annotation: Any, kind: type) -> bool:
    """Whether a field annotation accepts `kind` (int or float), looking through unions."""
    if annotation is kind:
        return True
    return any(_admits(a, kind) for a in get_args(annotation)) \
        if get_origin(annotation) not in (None, Literal) else False


def _literals(annotation: Any) -> set[Any]:
    """Values a field accepts through `Literal[...]`, looking through unions."""
    if get_origin(annotation) is Literal:
        return set(get_args(annotation))
    return set().union(*(_literals(a) for a in get_args(annotation))) \
        if get_origin(annotation) else set()


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for a in get_args(annotation):
        m = _model_of(a)
        if m is not None:
            return m
    return None


def _numeric_text(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _number_type_problem(v: Any, ann: Any, where: str) -> str | None:
    """A boolean or a string given where only a number belongs. YAML reads `k: true` as True
    and pydantic would take it as 1; a quoted `'inf'` or `'0.9'` would become a float after
    the finiteness and fraction checks had passed it by as text."""
    if not (_admits(ann, int) or _admits(ann, float)):
        return None
    if isinstance(v, bool) and not _admits(ann, bool):
        return f"{where}: expected a number, got {str(v).lower()}"
    if isinstance(v, str) and not _admits(ann, str) and v not in _literals(ann) and \
            _numeric_text(v):
        shown = v if len(v) <= 40 else v[:40] + "..."
        return f"{where}: expected a number, got the text {shown!r} (write it without quotes)"
    return None


def number_type_problems(model: type[BaseModel], raw: Any, prefix: str = "") -> list[str]:
    """`_number_type_problem` of every field of `raw`, walked along `model`'s fields (nested
    models, lists of them and string-keyed maps of numbers or of models)."""
    if not isinstance(raw, Mapping):
        return []
    out = []
    for name, field in model.model_fields.items():
        if name not in raw:
            continue
        v, ann, where = raw[name], field.annotation, f"{prefix}{name}"
        if (problem := _number_type_problem(v, ann, where)) is not None:
            out.append(problem)
        sub = _model_of(ann)
        if get_origin(ann) is dict and isinstance(v, Mapping):
            item = get_args(ann)[1] if len(get_args(ann)) == 2 else Any
            item_model = _model_of(item)
            for k, x in v.items():
                if item_model is not None:
                    out += number_type_problems(item_model, x, f"{where}.{k}.")
                elif (problem := _number_type_problem(x, item, f"{where}.{k}")) is not None:
                    out.append(problem)
        elif sub is not None and isinstance(v, Mapping):
            out += number_type_problems(sub, v, f"{where}.")
        elif sub is not None and isinstance(v, list):
            for i, item in enumerate(v):
                out += number_type_problems(sub, item, f"{where}.{i}.")
    return out


def shares_problem(where: str, shares: Sequence[float]) -> str | None:
    """Shares of the whole population (tiers, availability, hardware) add up to 1 (within
    1e-6)."""
    total = math.fsum(shares)
    if abs(total - 1.0) > 1e-6:
        return f"{where}: fractions add up to {total:g}, not 1"
    return None


def fraction_problems(population: object) -> list[str]:
    """Availability and hardware fractions cover the whole population (`shares_problem`); the
    tiers' rules are `raymm.population.devices.tier_problems`."""
    if not isinstance(population, Mapping):
        return []
    out = []
    for key in ("availability", "hardware"):
        items = population.get(key)
        if not isinstance(items, list) or not items or \
                not all(isinstance(x, Mapping) for x in items):
            continue
        shares = [x.get("fraction", 1.0) for x in items]
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s)
                   for s in shares):
            continue  # the schema reports the type
        problem = shares_problem(f"population.{key}", shares)
        if problem is not None:
            out.append(problem)
    return out


def data_size_problem(dataset: str, params: Any) -> str | None:
    """A generated dataset (synthetic, bench) whose arrays the scenario sizes itself: refuse
    one past MAX_DATA_VALUES float32 values before generating it."""
    if dataset == "synthetic":
        per_sample = sum(s.dim * (s.length or 1) for s in params.sensors.values())
        n = (params.n_train + params.n_test + params.classes) * per_sample  # + class means
        fields = "dataset.n_train, dataset.n_test, dataset.classes or the sensors' dim/length"
    elif dataset == "bench":
        n = (params.clients * params.samples_per_client + params.test_samples) * params.dim
        fields = "dataset.clients, dataset.samples_per_client or dataset.dim"
    else:
        return None
    if n > MAX_DATA_VALUES:
        return (f"dataset: {n:,} values ({n * 4 / 2**30:.1f} GiB) is more than this simulator "
                f"generates ({MAX_DATA_VALUES:,}); lower {fields}")
    return None
