"""Keys a scenario file may still use under an older name: each is moved to where the schema
keeps it now, with one notice naming the new spelling, so every committed scenario and every
run's `config.yaml` keeps loading."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: old path -> (new path, how an old value reads under the new key)
RENAMED: dict[tuple[str, ...], tuple[tuple[str, ...], Callable[[Any], Any]]] = {
    ("training", "vectorise"): (
        ("execution", "training", "path"),
        lambda v: ("lockstep" if v else "sequential") if isinstance(v, bool) else v),
    ("training", "vectorise_chunk"): (("execution", "training", "chunk"), lambda v: v),
    ("training", "closed_form"): (("execution", "training", "closed_form"), lambda v: v),
    ("training", "threads"): (("execution", "training", "threads"), lambda v: v),
    ("execution", "device"): (("execution", "accelerator"), lambda v: v),
}

_said: set[str] = set()


def _pop(node: dict[str, Any], path: tuple[str, ...]) -> Any:
    """Remove and return the value at `path`, which `_has` found."""
    for key in path[:-1]:
        node = node[key]
    return node.pop(path[-1])


def _has(node: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return True


def set_path(node: dict[str, Any], path: Sequence[str], value: Any) -> None:
    """`node[a][b]... = value` for path (a, b, ...), making the mappings on the way (a
    non-mapping on the way is replaced)."""
    for key in path[:-1]:
        nxt = node.get(key)
        if not isinstance(nxt, dict):
            nxt = {}
            node[key] = nxt
        node = nxt
    node[path[-1]] = value


def migrate(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the mapping with every old key moved to its new place, the renames made as
    "old -> new", problems: an old key given beside its new one). The input is not mutated."""
    out = copy.deepcopy(dict(raw))
    renames: list[str] = []
    problems: list[str] = []
    for old, (new, convert) in RENAMED.items():
        if not _has(out, old):
            continue
        old_name, new_name = ".".join(old), ".".join(new)
        if _has(out, new):
            problems.append(f"{old_name}: the old name of {new_name}, which is set too; "
                            f"keep {new_name} only")
            continue
        set_path(out, new, convert(_pop(out, old)))
        renames.append(f"{old_name} -> {new_name}")
    return out, renames, problems


def migrate_override(parts: list[str], value: Any) -> tuple[list[str], Any, str | None]:
    """A `--set` key under its new name (and its value as the new key reads it), and the
    rename made ("old -> new") or None: an old key on the command line overrides the file's
    new one, as any `--set` does."""
    moved = RENAMED.get(tuple(parts))
    if moved is None:
        return parts, value, None
    new, convert = moved
    return list(new), convert(value), f"{'.'.join(parts)} -> {'.'.join(new)}"


def notice(renames: list[str], source: str | None = None) -> None:
    """One line on stderr naming the renamed keys, once per process for the same keys."""
    if not renames:
        return
    line = (f"raymm: notice: {source + ': ' if source else ''}renamed keys read under their "
            f"new names: {', '.join(renames)} (write the new names; docs/scenario.md)")
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)
