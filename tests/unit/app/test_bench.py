"""The benchmark workload: raymm's `bench` dataset and model are the bare loop's, and
`raymm bench` runs both and reports steady seconds per round side by side."""

import json
from argparse import Namespace

import numpy as np
import pytest
import torch

from raymm.app import bare_loop as bl
from raymm.app import bench, bench_floor
from raymm.app.build import build_world, load_scenario
from raymm.errors import RaymmError
from raymm.models.build import build_model

from needs import needs_intel_digest


def test_bench_dataset_and_model_are_the_workloads():
    cfg = bl.build_parser().parse_args(["--clients", "30", "--seed", "3"])
    sc = load_scenario(bench.SCENARIO, ["dataset.clients=30", "population.devices=30",
                                        "selection.k=5", "seed=3"])
    world = build_world(sc)
    train, pop = world.dataset.train, world.population
    for cid in (0, 7, 29):  # device c holds exactly client c's samples, in order
        x, y = bl.client_data(cid, cfg)
        rows = pop.indices(cid)
        assert np.array_equal(train.x["x"][rows], x.numpy())
        assert np.array_equal(train.y[rows], y.numpy())
    x_test, y_test = bl.test_data(cfg)
    assert np.array_equal(world.dataset.test.x["x"], x_test.numpy())
    assert np.array_equal(world.dataset.test.y, y_test.numpy())
    model = build_model(world.dataset, sc.model, sc.seed)
    ref = bl.build_model(cfg)
    assert [tuple(p.shape) for p in model.parameters()] == \
        [tuple(p.shape) for p in ref.parameters()]                      # 64x64, 64, 6x64, 6
    assert sum(p.numel() for p in model.parameters()) == 4550
    # same function of the weights: load the bare loop's weights, compare outputs
    with torch.no_grad():
        for (_, p), q in zip(model.named_parameters(), ref.parameters()):
            p.copy_(q)
        xb = torch.randn(5, 64)
        out = model({"x": xb}, torch.ones(5, 1)).logits
        torch.testing.assert_close(out, ref(xb))


def test_steady_and_sizes():
    assert bench.steady([9.0, 1.0, 3.0]) == 2.0
    assert bench.parse_sizes("1000:100,5000:500") == [(1000, 100), (5000, 500)]


def test_executors_parse_and_bad_ones_are_named():
    assert bench.parse_executors("ray") == ["ray"]
    assert bench.parse_executors("serial, ray,serial") == ["serial", "ray"]
    for bad in ("dask", "ray,gpu", ","):
        with pytest.raises(RaymmError, match="bench --executor"):
            bench.parse_executors(bad)


def test_bench_modes_are_the_training_paths_and_the_old_name_still_reads():
    assert bench.parse_modes("sequential,lockstep") == ["sequential", "lockstep"]
    assert bench.parse_modes("vectorised") == ["lockstep"]
    for bad in ("fast", "lockstep,gpu", ","):
        with pytest.raises(RaymmError, match="bench: --modes"):
            bench.parse_modes(bad)


@pytest.mark.slow
def test_bench_command_reports_both_implementations(tmp_path, capsys):
    args = Namespace(sizes="40:4", rounds=2, seed=0, modes="sequential,lockstep",
                     executor="serial", bare_loop=None, out=tmp_path, overrides=[], repeat=1)
    rows = bench.main(args)
    assert [r["impl"] for r in rows] == ["bare_loop", "raymm sequential", "raymm lockstep"]
    assert rows[0]["ratio"] == 1.0
    for r in rows:
        assert r["steady_s"] > 0 and r["ratio"] == pytest.approx(r["steady_s"] /
                                                                 rows[0]["steady_s"])
        assert len(r["round_seconds"]) in (2, 3) and 0 <= r["final_acc"] <= 1
        # raymm's timed rounds: no device fell back from lock-step training
        assert r.get("fallbacks", [0, 0]) == [0, 0] and r.get("fallbacks_all", [0]) == [0]
    # sequential and lock-step raymm train the same model (to float32 rounding)
    assert rows[1]["final_acc"] == pytest.approx(rows[2]["final_acc"], abs=0.01)
    assert all(r["tree_pss_mb"] > 0 for r in rows)  # raymm's tree is read between rounds
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert len(saved["rows"]) == 3 and saved["meta"]["executor"] == "serial"
    [floor] = saved["floors"]
    assert (floor["N"], floor["K"]) == (40, 4) and floor["seconds"] > 0
    assert floor["ratio"] == pytest.approx(floor["seconds"] / rows[0]["steady_s"])
    assert floor["gflop"] == pytest.approx(bench_floor.round_flops(4, 64, 64, 6, 64, 32, 1) / 1e9)
    out = capsys.readouterr().out
    assert "bare_loop" in out and "arithmetic floor" in out and "N=40 K=4 matrix products" in out
    assert "lock-step fallbacks per round [0, 0]" in out


def test_the_floor_counts_the_products_a_lockstep_step_makes():
    """`round_flops` against what autograd runs for one minibatch of k devices' MLPs under
    vmap (the first layer's input needs no gradient), counted by torch's FLOP counter."""
    from torch.func import vmap
    from torch.utils.flop_counter import FlopCounterMode

    k, d, h, c, b = 7, 12, 10, 5, 9
    g = torch.Generator().manual_seed(0)
    w1, w2 = (torch.randn(k, h, d, generator=g, requires_grad=True),
              torch.randn(k, c, h, generator=g, requires_grad=True))
    b1, b2 = torch.zeros(k, h, requires_grad=True), torch.zeros(k, c, requires_grad=True)
    x, y = torch.randn(k, b, d, generator=g), torch.randint(0, c, (k, b), generator=g)

    def loss(w1, b1, w2, b2, x, y):  # noqa: ANN001, ANN202
        hidden = torch.relu(torch.nn.functional.linear(x, w1, b1))
        return torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, w2, b2), y)

    with FlopCounterMode(display=False) as count:
        total = vmap(loss)(w1, b1, w2, b2, x, y).sum()
        torch.autograd.grad(total, [w1, b1, w2, b2])
    assert count.get_total_flops() == bench_floor.round_flops(k, d, h, c, b, b, 1)
    # the same products in the step written out (`raymm.training.lockstep.closed_form`, the default)
    from raymm.training.lockstep.closed_form import Dense, _chain_step
    layers = [Dense("w1", "b1", True), Dense("w2", "b2", False)]
    params = {"w1": w1.detach(), "b1": b1.detach(), "w2": w2.detach(), "b2": b2.detach()}
    with FlopCounterMode(display=False) as count:
        _chain_step(layers, params, x, y, torch.ones(k, b))
    assert count.get_total_flops() == bench_floor.round_flops(k, d, h, c, b, b, 1)
    # two local steps of the standard workload at K = 500: 598 MFLOP
    assert bench_floor.round_flops(500, 64, 64, 6, 64, 32, 1) == 598_016_000


def test_the_floor_is_timed_on_one_thread_and_leaves_the_setting_alone():
    before = torch.get_num_threads()
    seconds = bench_floor.matmul_floor(20, 64, 64, 6, 64, 32, 1, repeat=2)
    assert 0 < seconds < 1 and torch.get_num_threads() == before


@needs_intel_digest
def test_the_bare_loop_is_the_workload_to_the_bit(capsys):
    """docs/workload.md fixes every draw and every summation order, so the final weights are a
    known value. The digest was printed by an independent implementation of the same spec for
    these arguments (and by this one: they agree); accuracies are as that one printed them."""
    assert bl.main(["--clients", "50", "--per-round", "10", "--rounds", "3", "--seed", "0"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("RESULT ")][-1]
    res = json.loads(line[len("RESULT "):])
    assert res["weights_sha"] == "25ba0184a1018d57"
    assert (res["initial_acc"], res["final_acc"]) == (0.099, 0.479)
    assert len(res["round_seconds"]) == 3 and res["peak_rss_mb"] > 0


def test_fedavg_weights_each_client_by_its_share_in_float64():
    a, b = torch.tensor([1.0, 0.1]), torch.tensor([4.0, 0.7])
    (out,) = bl.fedavg([(1, [a]), (3, [b])])
    assert out.dtype == torch.float32
    expected = (a.double() * 0.25 + b.double() * 0.75).float()
    assert torch.equal(out, expected)                         # [3.25, 0.55]


def test_bench_runs_the_packaged_loop_unless_given_a_script(tmp_path):
    from raymm.errors import RaymmError

    assert bench.bare_command(None)[1:] == ["-m", "raymm.app.bare_loop"]
    script = tmp_path / "other_loop.py"
    assert bench.bare_command(script)[1:] == [str(script)]
    args = bench.build_parser().parse_args(["--bare-loop", str(script)])
    with pytest.raises(RaymmError, match="other_loop.py"):
        bench.main(args)                                      # not there: one clear message
