"""Generate docs/scenario.md from the scenario schema, so the reference cannot drift.

`python -m raymm.app.schema_doc > docs/scenario.md`; a test checks the committed file is current.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

import policies  # noqa: F401  (registers every policy)
from raymm.config.limits import INT_BOUNDS, MAX_DATA_VALUES
from raymm.config.schema import Scenario
from raymm.io.paths import NAME_MAX
from raymm.models.size import MAX_MODEL_PARAMS
from raymm.protocol.registry import POLICY_SECTIONS


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    if isinstance(tp, type):
        return "null" if tp is type(None) else tp.__name__
    return str(tp)


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        d = field.default
        return "(section)" if isinstance(d, BaseModel) else f"`{d!r}`"
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, list) and value and isinstance(value[0], BaseModel):
            return f"`{[v.model_dump() for v in value]!r}`"
        return f"`{value!r}`"
    return "**required**"


def _nested(tp: Any) -> type[BaseModel] | None:
    for cand in (tp, *typing.get_args(tp)):
        if isinstance(cand, type) and issubclass(cand, BaseModel):
            return cand
        for inner in typing.get_args(cand):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return None


def attr_docs(cls: type) -> dict[str, str]:
    """`#:` comments written above class attributes, by attribute name (Sphinx style),
    inherited ones included (a subclass that changes one default keeps the others' docs)."""
    docs: dict[str, str] = {}
    for klass in reversed(inspect.getmro(cls)):
        if klass is not cls and klass.__module__.split(".")[0] in ("raymm", "policies"):
            docs.update(_own_attr_docs(klass))
    docs.update(_own_attr_docs(cls))
    return docs


def _own_attr_docs(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    pending: list[str] = []
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return docs
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
        elif (m := re.match(r"\s+(\w+)\s*:", line)) and pending:
            docs[m.group(1)] = " ".join(pending).replace("|", "\\|")
            pending = []
        else:
            pending = []
    return docs


def own_doc(cls: type) -> str:
    """The class's own docstring (not one inherited from BaseModel)."""
    return inspect.cleandoc(cls.__dict__.get("__doc__") or "")


def _section(model: type[BaseModel], prefix: str, out: list[str]) -> None:
    doc = own_doc(model)
    notes = attr_docs(model)
    rows, children = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        rows.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | "
                    f"{notes.get(name, '')} |")
        sub = _nested(field.annotation)
        if sub is not None and sub is not model:
            children.append((sub, key))
    out += [f"## `{prefix.rstrip('.') or 'top level'}`", "", doc, "",
            "| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for sub, key in children:
        is_list = typing.get_origin(model.model_fields[key.rsplit(".", 1)[-1]].annotation) \
            is not None and "list" in str(model.model_fields[key.rsplit(".", 1)[-1]].annotation)
        _section(sub, f"{key}[]." if is_list else f"{key}.", out)


def render() -> str:
    out = ["# Scenario reference", "",
           "Generated from `raymm/config/schema.py` by `python -m raymm.app.schema_doc`; do not "
           "edit by hand. Unknown keys are errors. Policy sections (`selection`, `aggregation`, "
           "`schedule`, `objective`) take `name` plus that policy's own parameters; "
           "`method:` names a preset whose values the scenario overrides.", "",
           "Rules no type below expresses (`raymm/config/limits.py`; the tiers': "
           "`raymm/population/devices.py`), checked with the rest: `name` "
           f"uses letters, digits, `.`, `_` and `-`, starts with a letter or digit and has at "
           f"most {NAME_MAX} characters; every number is finite (no `.inf`/`.nan`) and an "
           "integer fits int64; `true`/`false` or quoted text (`'3'`, `'inf'`) is never a "
           "number, while `1e-3` is one (as in YAML 1.2); the `fraction`s of "
           "`population.tiers`, `population.availability` and `population.hardware` add up to "
           "1 (within 1e-6); `tiers`, when given, has at least one tier; a key appears once per "
           "mapping; sizes are bounded ("
           + ", ".join(f"`{'.'.join(k)}` ≤ {v:,}" for k, v in INT_BOUNDS.items()
                       if k[0] in ("rounds", "population", "dataset", "model"))
           + f"; a model of at most {MAX_MODEL_PARAMS:,} parameters and generated data of at "
           f"most {MAX_DATA_VALUES:,} values).", ""]
    _section(Scenario, "", out)
    out += _policy_params()
    return "\n".join(out).rstrip() + "\n"


def _policy_params() -> list[str]:
    out = ["# Policies and their parameters", ""]
    for section, reg in POLICY_SECTIONS.items():
        for name in reg.names():
            params = reg.params_model(name)
            cls = reg.get(name)
            out += [f"## `{section}: {{name: {name}}}`", "", own_doc(cls).split("\n\n")[0],
                    ""]
            notes = attr_docs(params)
            if params.model_fields:
                out += ["| parameter | type | default | meaning |", "|---|---|---|---|"]
                out += [f"| `{k}` | {_type_name(f.annotation)} | {_default(f)} | "
                        f"{notes.get(k, '')} |" for k, f in params.model_fields.items()]
            else:
                out.append("No parameters.")
            out.append("")
    return out


if __name__ == "__main__":
    sys.stdout.write(render())
