"""The named methods (policies.presets): every preset names registered policies with
parameters their models accept, each FedMChain ablation removes one component, and `--methods
all` runs the named methods, not the ablations."""

from __future__ import annotations

import pytest

import policies
from raymm.app.validate import check_scenario
from raymm.protocol.registry import POLICY_SECTIONS

from helpers import tiny_scenario


@pytest.mark.parametrize("name", sorted(policies.PRESETS))
def test_every_preset_builds_its_policies_from_their_params(name: str) -> None:
    preset = policies.PRESETS[name]
    assert set(preset) >= {"selection", "aggregation"}, name
    for section, registry in POLICY_SECTIONS.items():
        spec = dict(preset.get(section, {}))
        if not spec:
            continue
        policy = spec.pop("name")
        assert policy in registry, (name, section, policy)
        registry.build(policy, spec)          # its parameters are the policy's own


def test_each_ablation_removes_one_component_and_is_not_a_method() -> None:
    full = policies.PRESETS["fedmchain"]
    differs = {}
    for name, preset in policies.PRESETS.items():
        if name.startswith("fedmchain_wo_"):
            differs[name] = sorted(k for k in full if preset.get(k) != full[k])
            assert name not in policies.METHODS
    assert differs == {"fedmchain_wo_mcft": ["objective", "schedule"],
                       "fedmchain_wo_ssca": ["aggregation"], "fedmchain_wo_ra": ["objective"],
                       "fedmchain_wo_rc": ["objective"], "fedmchain_wo_rarc": ["objective"]}
    assert set(policies.METHODS) <= set(policies.PRESETS)


def test_a_scenarios_own_keys_override_its_preset() -> None:
    sc = check_scenario(tiny_scenario(method="fedyogi", **{"aggregation.eta": 0.5}),
                        policies.PRESETS)
    assert sc.aggregation.name == "fedyogi" and sc.aggregation.params()["eta"] == 0.5
    assert sc.selection.name == "random" and sc.objective.name == "ce"
