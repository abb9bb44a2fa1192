"""The bare single-process loop (raymm.app.bare_loop): the standard workload to the bit, and
its FedAvg in float64."""

import json

import torch

from raymm.app import bare_loop as bl

from needs import needs_intel_digest


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
