"""Every run directory holds its trained model, and `raymm.load_model` gives it back: the
global model scores the run's final accuracy; a device's model is its cluster's, its own, or
carries its adapter."""

import numpy as np
import pytest

import raymm
from raymm.app.api import run
from raymm.app.build import build_world, load_scenario
from raymm.driver import checkpoint
from raymm.errors import RaymmError
from raymm.io import statefile
from raymm.models import LOCAL, GroupLayout
from raymm.server.evaluation import evaluate_subset

from helpers import REPO, tiny_scenario


def test_global_model_reproduces_the_final_accuracy(tmp_path):
    raw = tiny_scenario(rounds=3)
    res = run(raw, out=tmp_path)
    assert (res.run_dir / "model.safetensors").is_file()
    assert not (res.run_dir / "device_models.safetensors").exists()  # FedAvg keeps nothing
    net = raymm.load_model(res.run_dir)
    flat = GroupLayout(net).flatten(net, list(res.params))
    for g, v in res.params.items():
        assert np.array_equal(flat[g], v), g
    world = build_world(load_scenario(raw))
    acc = evaluate_subset(net, world.dataset.test, world.dataset.sensors).accuracy
    assert acc == res.summary["final_accuracy"]
    # readable by plain safetensors as the module's named parameters
    from safetensors.numpy import load_file

    names = set(load_file(res.run_dir / "model.safetensors"))
    assert names == {n for n, _ in net.named_parameters()}


def test_device_models_adapters_and_clusters(tmp_path):
    tide = run(tiny_scenario(method="tide", rounds=4, **{
        "output.checkpoint_every": 4, "selection": {"name": "tide", "k": 5},
        "aggregation": {"name": "tide", "warmup": 2}}), out=tmp_path / "tide")
    hosts = checkpoint.load(tide.run_dir).hosts
    dev = next(iter(hosts))
    adapter = hosts[dev] if isinstance(hosts[dev], np.ndarray) else hosts[dev]["local"]
    net = raymm.load_model(tide.run_dir, device=dev)
    assert np.array_equal(GroupLayout(net).flatten(net, [LOCAL])[LOCAL], adapter)
    fm = run(REPO / "scenarios" / "fedmchain_synthetic.yaml",
             ["rounds=6", "training.sync_every=2", "eval.every=3", "output.tensorboard=false"],
             out=tmp_path / "fm", executor="serial")
    tree, _ = statefile.read(fm.run_dir / "device_models.safetensors", "raymm-device-models")
    clusters = tree["clusters"]
    g = next(g for g in clusters["clustered"] if clusters["clustered"][g].any())
    d = int(np.flatnonzero(clusters["clustered"][g])[0])
    mine = raymm.load_model(fm.run_dir, device=d)
    k = int(clusters["assignment"][g][d])
    assert np.array_equal(GroupLayout(mine).flatten(mine, [g])[g], clusters["params"][g][k])
    with pytest.raises(RaymmError, match="device must be an id"):
        raymm.load_model(fm.run_dir, device=10**6)


def test_local_baseline_devices_load_their_own_parameters(tmp_path):
    res = run(tiny_scenario(method="local", rounds=2, **{
        "population.local_test_fraction": 0.2, "selection": {"name": "random", "k": 5}}),
        out=tmp_path)
    tree, _ = statefile.read(res.run_dir / "device_models.safetensors", "raymm-device-models")
    dev, own = next(iter(tree["devices"].items()))
    net = raymm.load_model(res.run_dir, device=dev)
    flat = GroupLayout(net).flatten(net)
    for key, v in own.items():
        assert np.array_equal(flat[key.removeprefix("params/")], v), key


def test_missing_or_damaged_model_is_a_clear_error(tmp_path):
    res = run(tiny_scenario(rounds=1), out=tmp_path)
    path = res.run_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(RaymmError, match="checksum mismatch"):
        raymm.load_model(res.run_dir)
    path.unlink()
    with pytest.raises(RaymmError, match="no model.safetensors"):
        raymm.load_model(res.run_dir)
