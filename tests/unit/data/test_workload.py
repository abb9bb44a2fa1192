"""The standard benchmark workload for raymm (raymm.data.workload): the `bench` dataset and
model are the bare loop's, client by client."""

import numpy as np
import torch

from raymm.app import bare_loop as bl
from raymm.app import bench
from raymm.app.build import build_world, load_scenario
from raymm.models.build import build_model


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
