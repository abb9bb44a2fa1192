"""Generate docs/scenario.md from the scenario schema, so the reference cannot drift.

`python -m raymm.app.schema_doc > docs/scenario.md`; a test checks the committed file is current.
The reference lists raymm's own policies; what plugins register (`raymm.app.plugins`) is listed
after it, in a section of its own, by `python -m raymm.app.schema_doc --plugin MODULE` (and as
text by `raymm plugins list`), so the committed reference is the same with or without plugins.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

import policies  # noqa: F401  (registers every policy)
from raymm.app import plugins
from raymm.config.limits import INT_BOUNDS, MAX_DATA_VALUES
from raymm.config.schema import Scenario
from raymm.data.base import DATASETS
from raymm.io.paths import NAME_MAX
from raymm.models.factory import MODELS
from raymm.models.size import MAX_MODEL_PARAMS
from raymm.protocol.registry import POLICY_SECTIONS, PRESETS


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


def render(with_plugins: bool = False) -> str:
    """The scenario reference; `with_plugins` appends what the loaded plugins register."""
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
    if with_plugins:
        out += plugins_markdown()
    return "\n".join(out).rstrip() + "\n"


def _policy_params() -> list[str]:
    out = ["# Policies and their parameters", ""]
    for section, reg in POLICY_SECTIONS.items():
        for name in reg.names():
            if plugins.origin(section, name) is None:  # raymm's own; plugins' come after
                out += _policy_entry(section, name)
    return out


def _policy_entry(section: str, name: str, heading: str = "##") -> list[str]:
    reg = POLICY_SECTIONS[section]
    out = [f"{heading} `{section}: {{name: {name}}}`", "",
           own_doc(reg.get(name)).split("\n\n")[0], ""]
    return out + _param_table(reg.params_model(name)) + [""]


def _param_table(params: type[BaseModel]) -> list[str]:
    notes = attr_docs(params)
    if not params.model_fields:
        return ["No parameters."]
    return ["| parameter | type | default | meaning |", "|---|---|---|---|",
            *[f"| `{k}` | {_type_name(f.annotation)} | {_default(f)} | {notes.get(k, '')} |"
              for k, f in params.model_fields.items()]]


# --------------------------------------------------------------------------- plugins


def _provided() -> dict[str, dict[str, list[str]]]:
    """plugin module -> kind -> the names it registered, for every loaded plugin and every
    registered name that comes from outside raymm."""
    out: dict[str, dict[str, list[str]]] = {}
    for p in plugins.loaded():
        out[p.module] = {k: list(v) for k, v in p.provides.items()}
    tables: Mapping[str, Sequence[str]] = {
        "dataset": sorted(DATASETS), **{s: r.names() for s, r in POLICY_SECTIONS.items()},
        "preset": sorted(PRESETS), "model": sorted(MODELS)}
    for kind, names in tables.items():
        for name in names:
            mod = plugins.origin(kind, name)
            if mod is not None and name not in out.get(mod, {}).get(kind, []):
                out.setdefault(mod, {}).setdefault(kind, []).append(name)
    return out


def _plugin_entry(kind: str, name: str) -> tuple[str, str, list[str]]:
    """(heading, first docstring paragraph, parameter table) of one registered name."""
    if kind in POLICY_SECTIONS:
        return (f"`{kind}: {{name: {name}}}`", own_doc(POLICY_SECTIONS[kind].get(name)),
                _param_table(POLICY_SECTIONS[kind].params_model(name)))
    if kind == "dataset":
        loader = DATASETS[name]
        return (f"`dataset: {{name: {name}}}`", own_doc(type(loader)),
                _param_table(loader.Params))
    if kind == "preset":
        keys = [f"| `{k}` | `{v!r}` |" for k, v in _flat(PRESETS[name])]
        return (f"`method: {name}`", "", ["| key | value |", "|---|---|", *keys])
    fn = MODELS[name]
    return (f"`model: {{factory: {name}}}`", inspect.cleandoc(fn.__doc__ or ""),
            ["Its arguments are the scenario's `model.args`."])


def _flat(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in tree.items():
        if isinstance(v, Mapping) and v:
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def plugins_markdown() -> list[str]:
    """Markdown lines: every plugin and what it registers, with parameters."""
    provided = _provided()
    if not provided:
        return []
    out = ["# Plugins", "", "Registered by modules outside raymm (`raymm.app.plugins`).", ""]
    sources = {p.module: p.source for p in plugins.loaded()}
    for mod, kinds in provided.items():
        out += [f"## plugin `{mod}`", "", f"Loaded as: {sources.get(mod, 'imported')}.", ""]
        for kind in plugins.KINDS:
            for name in kinds.get(kind, []):
                heading, doc, table = _plugin_entry(kind, name)
                out += [f"### {heading}", ""]
                if doc:
                    out += [doc.split("\n\n")[0], ""]
                out += [*table, ""]
    return out


def plugins_text() -> str:
    """`raymm plugins list`: the plugins loaded and what each registers, with parameters."""
    flag = plugins.NO_ENTRY_POINTS
    lines = [f"entry points (group {plugins.ENTRY_POINT_GROUP}): "
             + ("not loaded (" + flag + " is set)" if os.environ.get(flag, "") not in ("", "0")
                else "loaded")]
    provided = _provided()
    if not provided:
        lines.append("no plugins loaded (raymm plugins list --plugin MODULE to see one)")
    sources = {p.module: p.source for p in plugins.loaded()}
    for mod, kinds in provided.items():
        lines.append(f"plugin {mod} ({sources.get(mod, 'imported')})")
        if not kinds:
            lines.append("  registers nothing")
        for kind in plugins.KINDS:
            for name in kinds.get(kind, []):
                lines.append(f"  {kind} {name}" + "".join(f"\n    {p}" for p in
                                                           _param_lines(kind, name)))
    return "\n".join(lines)


def _param_lines(kind: str, name: str) -> list[str]:
    if kind == "preset":
        return [f"{k}: {v!r}" for k, v in _flat(PRESETS[name])]
    if kind == "model":
        return ["arguments: the scenario's model.args"]
    params = DATASETS[name].Params if kind == "dataset" else \
        POLICY_SECTIONS[kind].params_model(name)
    notes = attr_docs(params)
    return [f"{k}: {_type_name(f.annotation).replace(chr(92), '')} = "
            f"{_default(f).strip('`')}" + (f"  ({notes[k]})" if notes.get(k) else "")
            for k, f in params.model_fields.items()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raymm.app.schema_doc",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                    help="also list what this module registers (repeatable; installed "
                         "distributions' plugins are listed with any --plugin)")
    args = ap.parse_args(argv)
    if args.plugins:
        plugins.load(args.plugins)
    sys.stdout.write(render(with_plugins=bool(args.plugins)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
