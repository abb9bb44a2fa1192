"""`raymm sweep --grid KEY=V1,V2,...`: a sweep over any scenario setting.

Each `--grid` names one key (any dotted path `--set` takes) and its values, separated by
commas outside brackets and quotes (`--grid 'model.hidden=[32,32],[64]'` is two values). The
sweep runs the product of every grid with the methods and seeds. Each point becomes a list of
`--set` overrides and a suffix of the run name, `_<key><value>` per grid in the order given
(`quick_lr1e-3_k10`): the key's last part (the whole dotted path, dots as `-`, when two grids
share a last part) and the value as typed, with every character a run name cannot hold
replaced by `-`. A name that would pass raymm's 100 characters keeps its head and ends with a
digest of the point, so it stays unique. Two points that still come out with one name (values
differing only in characters that were replaced) are refused by the sweep's clash check.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from raymm.errors import ScenarioError
from raymm.io.paths import NAME_MAX

#: keys a grid may not sweep: the seed has --seeds, the name is what the grid writes
RESERVED = ("seed", "name")
UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


@dataclass(frozen=True)
class Grid:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class GridPoint:
    """One combination: the overrides that make it and the run-name suffix that tells it."""

    overrides: tuple[str, ...] = ()
    suffix: str = ""


def parse_grid(item: str) -> Grid:
    """`key.path=v1,v2` -> Grid; a ScenarioError for a malformed one."""
    key, eq, raw = item.partition("=")
    key = key.strip()
    if not eq or not key or any(not p for p in key.split(".")):
        raise ScenarioError([f"--grid {item!r}: expected key.path=value1,value2,..."])
    if key in RESERVED:
        raise ScenarioError([f"--grid {key}: not a grid key (use --seeds for seeds; the run "
                             "names are made from the grid)"])
    values = tuple(v.strip() for v in split_values(raw))
    if not values or any(not v for v in values):
        raise ScenarioError([f"--grid {item!r}: an empty value; give values separated by "
                             "commas"])
    if len(set(values)) != len(values):
        raise ScenarioError([f"--grid {key}: a value is given twice ({raw})"])
    return Grid(key, values)


def split_values(raw: str) -> list[str]:
    """Split at the commas that are outside brackets, braces and quotes."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in raw:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return out


def grid_points(items: Sequence[str]) -> list[GridPoint]:
    """Every combination of the `--grid` items, in the order given (the last varies fastest);
    one empty point when there is no grid."""
    grids = [parse_grid(i) for i in items]
    keys = [g.key for g in grids]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ScenarioError([f"--grid {k}: given twice; list all its values in one --grid"
                             for k in dup])
    shorts = [k.rsplit(".", 1)[-1] for k in keys]
    labels = [s if shorts.count(s) == 1 else k.replace(".", "-") for s, k in zip(shorts, keys)]
    points = []
    for combo in itertools.product(*[g.values for g in grids]):
        sets = tuple(f"{k}={v}" for k, v in zip(keys, combo))
        suffix = "".join(f"_{label}{safe_value(v)}" for label, v in zip(labels, combo))
        points.append(GridPoint(sets, suffix))
    return points


def safe_value(value: str) -> str:
    """The value as a run name may hold it."""
    return UNSAFE.sub("-", value).strip("-") or "x"


def grid_name(name: str, point: GridPoint) -> str:
    """`name` + the point's suffix, shortened to a safe run name with a digest of the point
    when it would be too long (room is kept for the sweep's `-seed<seed>`)."""
    full = name + point.suffix
    limit = NAME_MAX - 12
    if len(full) <= limit:
        return full
    digest = hashlib.sha256("\n".join(point.overrides).encode()).hexdigest()[:8]
    return f"{full[: limit - 9]}-{digest}"
