"""cluster.yaml (cloud) and cluster-local.yaml (on-prem) are valid Ray cluster launcher configs
that install raymm from the checkout and start every node with token authentication."""

import copy

import pytest
import yaml

from helpers import REPO

CONFIGS = ["cluster.yaml", "cluster-local.yaml"]


@pytest.mark.parametrize("name", CONFIGS)
def test_cluster_config_passes_rays_own_validation(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((REPO / name).read_text())
    validate_config(prepare_config(copy.deepcopy(raw)))  # raises on any schema error
    assert raw["file_mounts"]["~/raymm"] == "."
    setup = "\n".join(raw["setup_commands"])
    assert "requirements.txt" in setup and "install -q --no-deps -e ." in setup
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in raw[key] if "ray start" in c]
        assert start and all("RAY_AUTH_MODE=token" in c for c in start), key


def test_cloud_config_has_head_and_worker_types():
    raw = yaml.safe_load((REPO / "cluster.yaml").read_text())
    assert raw["provider"]["type"] == "aws"
    types = raw["available_node_types"]
    assert raw["head_node_type"] in types and len(types) >= 2
    # DeviceActors stay off the head: it advertises no CPUs
    assert types[raw["head_node_type"]]["resources"] == {"CPU": 0}


def test_onprem_config_uses_the_local_provider():
    raw = yaml.safe_load((REPO / "cluster-local.yaml").read_text())
    assert raw["provider"]["type"] == "local" and raw["provider"]["worker_ips"]


@pytest.mark.parametrize("name", CONFIGS)
def test_token_file_is_private_on_every_node(name):
    raw = yaml.safe_load((REPO / name).read_text())
    assert "~/.ray/auth_token" in raw["file_mounts"]
    assert raw["setup_commands"][0] == "chmod 600 ~/.ray/auth_token"


def test_cloud_nodes_use_internal_ips_and_a_restricted_group():
    raw = yaml.safe_load((REPO / "cluster.yaml").read_text())
    assert raw["provider"]["use_internal_ips"] is True
    assert raw["provider"]["security_group"]["GroupName"]
    assert "0.0.0.0/0" not in (REPO / "cluster.yaml").read_text()
    assert "--dashboard-host" not in (REPO / "cluster.yaml").read_text()  # localhost only
