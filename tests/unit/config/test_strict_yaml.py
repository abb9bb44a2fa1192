"""YAML read strictly (raymm.config.strict_yaml): unique keys, plain keys, bounded nesting,
numbers a reader means; and written so that it reads back as the same values."""

from __future__ import annotations

import pytest
import yaml

from raymm.config.strict_yaml import MAX_YAML_DEPTH, dump_yaml, load_yaml


def test_a_key_given_twice_is_refused_with_both_lines() -> None:
    with pytest.raises(yaml.YAMLError, match=r"duplicate key 'rounds' \(first at line 1\)"):
        load_yaml("rounds: 3\nseed: 1\nrounds: 4\n")
    with pytest.raises(yaml.YAMLError, match="must be a plain value"):
        load_yaml("? [a, b]\n: 1\n")


def test_nesting_is_bounded() -> None:
    def nested(n: int) -> str:
        return "[" * n + "]" * n

    assert load_yaml(nested(MAX_YAML_DEPTH)) is not None
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_YAML_DEPTH}"):
        load_yaml(nested(MAX_YAML_DEPTH + 1))
    assert load_yaml("") is None


def test_an_exponent_without_a_dot_is_a_number_and_text_stays_text() -> None:
    assert load_yaml("lr: 1e-3\nbig: 1.0e5\nname: '1e5'\n") == \
        {"lr": 0.001, "big": 100000.0, "name": "1e5"}
    data = {"name": "1e5", "lr": 0.001, "tiers": [{"sensors": ["a"], "count": 3}], "on": "yes"}
    text = dump_yaml(data)
    assert load_yaml(text) == data and list(load_yaml(text)) == list(data)
