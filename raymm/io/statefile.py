"""Nested state as data: arrays in a safetensors file, everything else as JSON in its header.

Checkpoints and saved models travel between machines and people, so reading one must never run
code (a pickle can). A state tree is split into a JSON skeleton and a table of arrays:

- ``None``, ``bool``, ``int``, ``str``, finite ``float``, ``list`` and string-keyed ``dict``
  are themselves (a dict key that starts with ``$`` makes its dict a tagged pair list);
- ``{"$f": "nan"|"inf"|"-inf"}``: a non-finite float (JSON has none);
- ``{"$n": dtype, "v": value}``: a numpy scalar, dtype kept (a round row's float32 stays one);
- ``{"$a": name}``: a numpy array, stored as tensor `name` of the safetensors file;
- ``{"$s": name, "keys": [...]}``: a dict whose values are arrays of one shape and dtype
  (e.g. 100,000 devices' adapters), stored stacked as one tensor;
- ``{"$t": [...]}``: a tuple; ``{"$d": [[key, value], ...]}``: any other dict (int keys).

New state keys of any of these types need no format change. The file's metadata holds the
format name, its version, the JSON skeleton and a SHA-256 over the skeleton and every tensor
(name, dtype, shape, bytes); `read` refuses a file whose checksum, version or structure does
not match, with the reason, and never returns part of one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, save

VERSION = 1
#: numpy dtypes a safetensors file can hold (no strings, objects or complex numbers)
DTYPES = frozenset({"bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64",
                    "int64", "float16", "float32", "float64"})
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class StateFormatError(ValueError):
    """A state file that cannot be trusted or read: the message says why."""


# --------------------------------------------------------------------------- encode


class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, np.ndarray] = {}

    def _store(self, arr: np.ndarray, where: str) -> str:
        if arr.dtype.name not in DTYPES:
            raise TypeError(f"{where}: arrays of dtype {arr.dtype} cannot be stored as data")
        name = str(len(self.tensors))
        # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
        self.tensors[name] = arr if arr.flags.c_contiguous else arr.copy(order="C")
        return name

    def key(self, k: Any, where: str) -> Any:
        if isinstance(k, (bool, np.bool_)):
            raise TypeError(f"{where}: boolean dict keys are not supported")
        if isinstance(k, (int, np.integer)):
            return int(k)
        if isinstance(k, str):
            return k
        raise TypeError(f"{where}: dict key {k!r} of type {type(k).__name__} is not supported")

    def value(self, v: Any, where: str) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, np.generic):  # before int/float: np.float64 is a float subclass
            if v.dtype.name not in DTYPES:
                raise TypeError(f"{where}: numpy scalar of dtype {v.dtype} is not supported")
            return {"$n": v.dtype.name, "v": self.value(v.item(), where)}
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            if math.isfinite(v):
                return float(v)
            return {"$f": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
        if isinstance(v, np.ndarray):
            return {"$a": self._store(v, where)}
        if isinstance(v, list):
            return [self.value(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if isinstance(v, tuple):
            return {"$t": [self.value(x, f"{where}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, Mapping):
            return self.mapping(v, where)
        raise TypeError(f"{where}: values of type {type(v).__name__} cannot be stored as data")

    def mapping(self, m: Mapping[Any, Any], where: str) -> Any:
        keys = [self.key(k, where) for k in m]
        vals = list(m.values())
        if len(vals) >= 2 and all(isinstance(a, np.ndarray) for a in vals) and \
                len({(a.dtype, a.shape) for a in vals}) == 1 and vals[0].dtype.name in DTYPES:
            return {"$s": self._store(np.stack(vals), where), "keys": keys}
        if all(isinstance(k, str) and not k.startswith("$") for k in keys):
            return {k: self.value(v, f"{where}.{k}") for k, v in zip(keys, vals)}
        return {"$d": [[k, self.value(v, f"{where}.{k}")] for k, v in zip(keys, vals)]}


def encode(tree: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """(JSON skeleton, tensors) of a state tree; TypeError names the first unsupported value."""
    enc = _Encoder()
    return enc.value(tree, "state"), enc.tensors


# --------------------------------------------------------------------------- decode


def _bad(msg: str) -> StateFormatError:
    return StateFormatError(f"malformed state: {msg}")


class _Decoder:
    def __init__(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.tensors = tensors

    def tensor(self, name: Any) -> np.ndarray:
        if not isinstance(name, str) or name not in self.tensors:
            raise _bad(f"reference to a missing tensor {name!r}")
        return self.tensors[name]

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if not isinstance(v, dict):
            raise _bad(f"unexpected JSON value of type {type(v).__name__}")
        tags = [k for k in v if k.startswith("$")]
        if not tags:
            return {k: self.value(x) for k, x in v.items()}
        return self.tagged(tags[0], v)

    def tagged(self, tag: str, v: dict[str, Any]) -> Any:
        if tag == "$a":
            return self.tensor(v["$a"])
        if tag == "$f" and v["$f"] in _NONFINITE:
            return _NONFINITE[v["$f"]]
        if tag == "$n" and v["$n"] in DTYPES and "v" in v:
            raw = self.value(v["v"])
            if isinstance(raw, (dict, list, str)) or raw is None:
                raise _bad(f"numpy scalar with value {raw!r}")
            return np.dtype(v["$n"]).type(raw)
        if tag == "$t" and isinstance(v["$t"], list):
            return tuple(self.value(x) for x in v["$t"])
        if tag == "$d" and isinstance(v["$d"], list):
            return {self.key(p): self.value(p[1]) for p in v["$d"]}
        if tag == "$s" and isinstance(v.get("keys"), list):
            stacked = self.tensor(v["$s"])
            keys = [self.key([k, None]) for k in v["keys"]]
            if stacked.ndim == 0 or stacked.shape[0] != len(keys):
                raise _bad(f"stacked tensor {v['$s']!r} does not match its {len(keys)} keys")
            # `[i, ...]`: a view even of stacked 0-d arrays (`[i]` would give numpy scalars)
            return {k: stacked[i, ...] for i, k in enumerate(keys)}
        raise _bad(f"unknown or malformed tag {tag!r}")

    @staticmethod
    def key(pair: Any) -> int | str:
        if not isinstance(pair, list) or len(pair) != 2:
            raise _bad("a dict entry is not a [key, value] pair")
        k = pair[0]
        if isinstance(k, bool) or not isinstance(k, (int, str)):
            raise _bad(f"dict key {k!r}")
        return k


def decode(skeleton: Any, tensors: Mapping[str, np.ndarray]) -> Any:
    """The state tree back from `encode`'s output; StateFormatError if it is malformed."""
    try:
        return _Decoder(tensors).value(skeleton)
    except RecursionError:
        raise _bad("nested too deeply") from None
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, StateFormatError):
            raise
        raise _bad(f"{type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------- files


def checksum(skeleton_json: str, tensors: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the JSON skeleton and every tensor's name, dtype, shape and bytes."""
    h = hashlib.sha256(skeleton_json.encode())
    for name in sorted(tensors):
        a = tensors[name]
        a = a if a.flags.c_contiguous else a.copy(order="C")
        h.update(f"\0{name}\0{a.dtype.name}\0{a.shape}\0".encode())
        h.update(a.reshape(-1).view(np.uint8).data if a.size else b"")
    return h.hexdigest()


def to_bytes(tree: Any, kind: str, extra: Mapping[str, str] | None = None) -> bytes:
    """A safetensors file holding `tree`; `kind` names what it is (checked by `from_bytes`)."""

    skeleton, tensors = encode(tree)
    text = json.dumps(skeleton, allow_nan=False, separators=(",", ":"))
    meta = {**(extra or {}), "format": kind, "version": str(VERSION), "state": text,
            "sha256": checksum(text, tensors)}
    return save(tensors, metadata=meta)


def read_tensors(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """(metadata, tensors) of a safetensors file; StateFormatError if it is not one."""

    try:
        data = path.read_bytes()
        meta = _metadata(data)
        return meta, load(data)
    except (SafetensorError, ValueError, OverflowError, MemoryError) as exc:
        raise StateFormatError(f"not a readable safetensors file ({exc})") from None


def _metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors header (the library's numpy loader drops it)."""
    if len(data) < 8:
        raise StateFormatError("file is too short to be a safetensors file")
    n = int.from_bytes(data[:8], "little")
    if n > min(len(data) - 8, 100_000_000):
        raise StateFormatError("header length exceeds the file")
    try:
        header = json.loads(data[8:8 + n])
    except (ValueError, RecursionError) as exc:
        raise StateFormatError(f"header is not JSON ({exc})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise StateFormatError("no raymm metadata in the header")
    return meta


def _verified(path: Path, kind: str, field: str) -> tuple[str, dict[str, np.ndarray]]:
    """(JSON text under `field`, tensors) once format, version and checksum are checked."""
    meta, tensors = read_tensors(path)
    if meta.get("format") != kind:
        raise StateFormatError(f"not a {kind} file (format {meta.get('format')!r})")
    if meta.get("version") != str(VERSION):
        raise StateFormatError(f"format version {meta.get('version')!r}; this raymm reads "
                               f"version {VERSION}")
    text = meta.get(field)
    if text is None or meta.get("sha256") != checksum(text, tensors):
        raise StateFormatError("checksum mismatch: the file is damaged or was altered")
    return text, tensors


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StateFormatError(f"state is not JSON ({exc})") from None


def read(path: Path, kind: str) -> tuple[Any, dict[str, str]]:
    """(state tree, metadata) of a file written by `to_bytes` with the same `kind`, after
    checking format, version and checksum. Raises StateFormatError with the reason."""
    text, tensors = _verified(path, kind, "state")
    return decode(_json(text), tensors), {"version": str(VERSION)}


def named_to_bytes(tensors: Mapping[str, np.ndarray], kind: str, info: Any) -> bytes:
    """A safetensors file of named tensors (e.g. a torch state dict, readable by any
    safetensors tool) with `info` as JSON, the format, version and checksum in its metadata."""

    arrays = {k: v if v.flags.c_contiguous else v.copy(order="C") for k, v in tensors.items()}
    text = json.dumps(info, allow_nan=False, separators=(",", ":"))
    return save(arrays, metadata={"format": kind, "version": str(VERSION), "info": text,
                                  "sha256": checksum(text, arrays)})


def read_named(path: Path, kind: str) -> tuple[dict[str, np.ndarray], Any]:
    """(tensors, info) of a `named_to_bytes` file of this `kind`, verified."""
    text, tensors = _verified(path, kind, "info")
    return tensors, _json(text)
