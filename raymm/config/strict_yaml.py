"""YAML read strictly: safe types only, unique keys, bounded nesting and size; and written
so that it reads back as the same values.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_YAML_DEPTH = 40
MAX_YAML_NODES = 200_000




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
