"""The scenario schema (raymm.config.schema): overrides parse their types and leave the input
alone."""

from raymm.config.schema import apply_overrides

from helpers import tiny_scenario


def test_overrides_do_not_mutate_and_parse_types():
    raw = tiny_scenario()
    out = apply_overrides(raw, ["rounds=9", "training.lr=0.5", "selection.name=all_online",
                                "execution.devices_per_actor=auto"])
    assert raw["rounds"] == 3 and out["rounds"] == 9 and out["training"]["lr"] == 0.5
    assert out["execution"]["devices_per_actor"] == "auto"
