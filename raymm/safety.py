"""Input that cannot hurt: run names, YAML, files to read, and numbers a scenario may ask for.

Everything here turns a hostile or mistaken input into a message naming the field, before
anything runs or is written: a run name that would leave `--out` or garble a terminal, YAML
with duplicate keys or nesting deep enough to crash the parser, a FIFO or device given as a
file (reading one hangs or never ends), NaN or infinity where a number must be finite, an
integer past int64, a boolean where a number belongs, and sizes that would exhaust memory.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel

#: run names: letters, digits, `.`, `_`, `-`, starting with a letter or digit; the run
#: directory `<name>-<YYYYmmdd-HHMMSS>[-n]` then stays well under a file name's 255 bytes
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_MAX = 100
MAX_YAML_BYTES = 10 << 20
MAX_YAML_DEPTH = 40
MAX_YAML_NODES = 200_000
INT64 = (-(2**63), 2**63 - 1)

#: upper bounds of integer fields whose size turns into memory or time (path -> bound)
INT_BOUNDS: dict[tuple[str, ...], int] = {
    ("rounds",): 10_000_000,
    ("population", "devices"): 5_000_000,
    ("dataset", "classes"): 100_000,
    ("selection", "k"): 5_000_000,
    ("training", "local_epochs"): 10_000,
    ("training", "batch_size"): 10_000_000,
    ("training", "threads"): 1024,
    ("training", "vectorise_chunk"): 1_000_000,
    ("training", "sync_every"): 10_000_000,
    ("model", "embed_dim"): 65_536,
    ("model", "hidden"): 65_536,
    ("model", "fusion_dim"): 65_536,
    ("eval", "every"): 10_000_000,
    ("eval", "batch_size"): 10_000_000,
    ("output", "checkpoint_every"): 10_000_000,
    ("output", "keep_checkpoints"): 1000,
    ("execution", "local_num_cpus"): 100_000,
    ("execution", "actor", "max_restarts"): 1000,
}
#: parameters of the model (float32), and float32 values of a generated dataset, past which a
#: scenario is refused before anything is built: 4 GiB each
MAX_MODEL_PARAMS = 1 << 30
MAX_DATA_VALUES = 1 << 30


def name_problems(name: Any, field: str = "name") -> list[str]:
    """Problems of a run name (empty when it is safe)."""
    if not isinstance(name, str):
        return []  # the schema reports the type
    if len(name) > NAME_MAX:
        return [f"{field}: at most {NAME_MAX} characters (got {len(name)})"]
    if not NAME_RE.fullmatch(name):
        return [f"{field}: {ascii(name)} is not a safe run name: use letters, digits, '.', '_' "
                "and '-', starting with a letter or digit (it names the run directory)"]
    return []


def inside(root: Path, path: Path) -> bool:
    """Whether `path` resolves to a place inside `root` (symbolic links followed)."""
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


# --------------------------------------------------------------------------- files


def regular_file(path: Path, what: str) -> str | None:
    """None when `path` is a regular file (links followed); else why it cannot be read as one.
    A FIFO blocks the reader forever and /dev/zero never ends: neither is data."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"{what} not found: {path}"
    except OSError as exc:
        return f"{what}: {path}: {exc.strerror or exc}"
    if stat.S_ISDIR(st.st_mode):
        return f"{what}: {path} is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        kind = "FIFO" if stat.S_ISFIFO(st.st_mode) else "device or socket"
        return f"{what}: {path} is a {kind}, not a regular file"
    return None


def special_file_problem(path: Path, what: str) -> str | None:
    """Why an existing path is neither a regular file nor a folder (a FIFO, a device, a
    socket); None otherwise, and for a missing path (its reader reports that)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = "FIFO" if stat.S_ISFIFO(mode) else "device or socket"
    return f"{what}: {path} is a {kind}, not a regular file"


def read_text(path: Path, what: str, max_bytes: int = MAX_YAML_BYTES) -> str:
    """A small regular text file; ValueError with the reason otherwise."""
    problem = regular_file(path, what)
    if problem:
        raise ValueError(problem)
    if path.stat().st_size > max_bytes:
        raise ValueError(f"{what}: {path} is larger than {max_bytes >> 20} MiB")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{what}: {path} is not a UTF-8 text file") from None


# --------------------------------------------------------------------------- YAML


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (YAML says keys are unique;
    PyYAML keeps the last one silently) and nesting deeper than MAX_YAML_DEPTH."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value", key_node.start_mark
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"duplicate key {key!r} (first at line {seen[key].line + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes the text `_StrictLoader` would read back as a number."""


# YAML 1.2 floats that PyYAML (YAML 1.1) reads as text: an exponent without a dot (`1e-3`) or
# with an unsigned exponent (`1.0e5`). A scenario's `lr: 1e-3` is a number, as a reader means;
# the dumper knows it too, so a text value `1e5` is written quoted and read back as text.
for _cls in (_StrictLoader, _Dumper):
    _cls.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."))


def dump_yaml(data: Any) -> str:
    """YAML that `load_yaml` reads back as the same values (keys in the given order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def _depth_ok(node: yaml.Node, limit: int) -> bool:
    stack = [(node, 1)]
    count = 0
    while stack:
        n, d = stack.pop()
        count += 1
        if d > limit or count > MAX_YAML_NODES:
            return False
        if isinstance(n, yaml.MappingNode):
            stack += [(x, d + 1) for pair in n.value for x in pair]
        elif isinstance(n, yaml.SequenceNode):
            stack += [(x, d + 1) for x in n.value]
    return True


def load_yaml(text: str) -> Any:
    """Parse YAML strictly: safe types only, unique keys, bounded nesting and size (aliases
    count once per use, so an alias bomb is refused too). Raises yaml.YAMLError or
    ValueError with the reason."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if not _depth_ok(node, MAX_YAML_DEPTH):
            raise ValueError(f"nested deeper than {MAX_YAML_DEPTH} levels or more than "
                             f"{MAX_YAML_NODES} values")
        return loader.construct_document(node)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
    finally:
        loader.dispose()


# --------------------------------------------------------------------------- values


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


def fraction_problems(population: Any) -> list[str]:
    """Availability and hardware fractions cover the whole population (`shares_problem`); the
    tiers' rules are `raymm.population.tier_problems`."""
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


def model_size_problem(model: Any, what: str = "model") -> str | None:
    """A model whose float32 parameters alone would need more than 4 GiB per copy."""
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_MODEL_PARAMS:
        return (f"{what}: {n:,} parameters ({n * 4 / 2**30:.1f} GiB per copy) is more than this "
                f"simulator allows ({MAX_MODEL_PARAMS:,}); lower model.embed_dim, "
                "model.hidden or model.fusion_dim")
    return None


def os_error_text(exc: OSError) -> str:
    """`[Errno 20] Not a directory: '/dev/null/x'` -> `/dev/null/x: not a directory`."""
    what = (exc.strerror or str(exc)).lower() if exc.strerror else str(exc)
    return f"{exc.filename}: {what}" if exc.filename is not None else what


def writable_dir_problem(out: Path, what: str = "--out") -> str | None:
    """Why run directories cannot be created under `out` (None when they can)."""
    p = out
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if not p.is_dir():
        return f"{what}: {p} is not a directory"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{what}: {p} is not writable"
    return None


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


def model_problem(sensors: tuple[str, ...], shapes: Mapping[str, tuple[int, ...]],
                  num_classes: int, spec: Any) -> str | None:
    """`model_size_problem` of the scenario's model for data of these sensors, input shapes
    and classes (a loaded `Dataset`'s, or a loader's `DataFacts` before any loading), built on
    torch's meta device (shapes only, no memory), so a huge embed_dim is a message, not an
    out-of-memory kill."""
    import torch

    from raymm.models import MultimodalNet

    with torch.device("meta"):
        net = MultimodalNet(sensors, {m: tuple(shapes[m]) for m in sensors}, num_classes, spec)
    return model_size_problem(net)
