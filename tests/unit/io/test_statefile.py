"""State files are data: every supported value comes back exactly, anything else is refused
with a reason, and nothing in a file is ever executed."""

import json
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from raymm.io import statefile
from raymm.io.statefile import StateFormatError

from helpers import Payload

DTYPES = st.sampled_from(["float32", "float64", "int64", "int32", "uint8", "bool", "int8"])
ARRAYS = DTYPES.flatmap(lambda d: hnp.arrays(d, hnp.array_shapes(min_dims=0, max_dims=3,
                                                                   min_side=0, max_side=4)))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**80, 2**80),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
                    st.floats(width=32).map(np.float32), st.integers(-5, 5).map(np.int64))
KEYS = st.one_of(st.text(max_size=5), st.integers(-3, 10**6))
TREES = st.recursive(st.one_of(SCALARS, ARRAYS), lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.tuples(kids, kids), st.dictionaries(KEYS, kids, max_size=4)),
    max_leaves=20)


def same(a, b):
    """Exact equality, types included (NaN equals NaN, -0.0 is not 0.0)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert type(k) is type(next(kk for kk in b if kk == k))
            same(a[k], b[k])
    elif isinstance(a, (float, np.floating)) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


@settings(max_examples=150, deadline=None)
@given(tree=TREES)
def test_any_supported_tree_round_trips_exactly(tree, tmp_path_factory):
    path = tmp_path_factory.mktemp("s") / "x.safetensors"
    path.write_bytes(statefile.to_bytes(tree, "test"))
    back, meta = statefile.read(path, "test")
    same(tree, back)
    assert meta["version"] == str(statefile.VERSION)


def test_stacked_zero_dimensional_arrays_come_back_as_arrays():
    """Found by the round-trip property: 0-d arrays of one dtype are stacked like any others,
    and each must come back a 0-d array, not a numpy scalar."""
    tree = {"": np.array(0.0, np.float32), 0: np.array(2.5, np.float32)}
    skeleton, tensors = statefile.encode(tree)
    assert "$s" in skeleton
    same(tree, statefile.decode(skeleton, tensors))


def test_devices_with_equal_arrays_are_stacked_into_one_tensor():
    hosts = {d: np.full(3, d, np.float32) for d in range(1000)}
    skeleton, tensors = statefile.encode({"hosts": hosts})
    assert len(tensors) == 1 and tensors["0"].shape == (1000, 3)
    back = statefile.decode(skeleton, tensors)["hosts"]
    assert list(back) == list(range(1000)) and back[7].tolist() == [7, 7, 7]


@pytest.mark.parametrize("value", [object(), {1.5: 1}, np.array(["a"]), np.array([1j]),
                                   {"x": [set()]}])
def test_values_that_are_not_data_are_refused_when_writing(value):
    with pytest.raises(TypeError, match="state"):
        statefile.to_bytes({"x": value}, "test")


def _rewrite_meta(path, **changes):
    """Rewrite header metadata keeping the tensors (what an attacker or a bug could do)."""
    from safetensors.numpy import load, save

    data = path.read_bytes()
    meta = statefile._metadata(data)
    meta.update(changes)
    path.write_bytes(save(load(data), metadata=meta))


def test_damage_version_kind_and_structure_are_refused_with_the_reason(tmp_path):
    p = tmp_path / "x.safetensors"
    good = statefile.to_bytes({"a": np.arange(100.0), "b": "text"}, "test")
    checks = {
        b"": "too short", b"garbage!garbage!": "header length",
        good[:-8]: "not a readable", good[:-8] + bytes(8)[:0] + b"\x01" * 8: "checksum",
    }
    for data, reason in checks.items():
        p.write_bytes(data)
        with pytest.raises(StateFormatError, match=reason):
            statefile.read(p, "test")
    p.write_bytes(good)
    with pytest.raises(StateFormatError, match="not a other file"):
        statefile.read(p, "other")
    _rewrite_meta(p, version="99")
    with pytest.raises(StateFormatError, match="version '99'"):
        statefile.read(p, "test")
    # a valid checksum over a malformed skeleton: still refused, never half-decoded
    for skeleton in ({"$a": "404"}, {"$zz": 1}, {"$n": "object", "v": 1}, {"$d": [[1.5, 2]]},
                     {"$s": "0", "keys": [1]}, "[" * 5000 + "]" * 5000):
        text = skeleton if isinstance(skeleton, str) else json.dumps(skeleton)
        p.write_bytes(good)
        from safetensors.numpy import load
        _rewrite_meta(p, state=text, sha256=statefile.checksum(text, load(good)))
        with pytest.raises(StateFormatError, match="malformed|not JSON"):
            statefile.read(p, "test")


def test_a_pickle_is_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "x.safetensors"
    p.write_bytes(pickle.dumps({"state": Payload(marker)}))
    with pytest.raises(StateFormatError):
        statefile.read(p, "test")
    assert not marker.exists()


@pytest.mark.parametrize("download", [True, np.array([True, False, True])])
def test_a_plan_made_ahead_comes_back_from_a_state_file_exactly(download):
    """A checkpoint can hold the next round's plan and payload (`Server.state_dict`), cluster
    models included; read back, they are the same values of the same types."""
    from raymm.protocol.messages import (
        Broadcast,
        ClusterModels,
        RoundPlan,
        plan_from_state,
        plan_state,
    )

    rng = np.random.default_rng(0)
    plan = RoundPlan(4, np.array([1, 5, 7]), ("sensor:a", "fusion"), download, False, ("a",))
    clusters = ClusterModels({"fusion": rng.random((2, 6), dtype=np.float32)},
                             {"fusion": np.array([0, 1, 1, 0, 0, 1, 0, 1])},
                             {"fusion": np.array([True, False] * 4)})
    bcast = Broadcast(4, {"fusion": rng.random(6, dtype=np.float32)},
                      {"prototypes": rng.random((3, 2))}, clusters)
    for b in (bcast, Broadcast(4, bcast.params)):
        skeleton, tensors = statefile.encode({"planned": plan_state(plan, b)})
        back_plan, back = plan_from_state(statefile.decode(json.loads(json.dumps(skeleton)),
                                                           tensors)["planned"])
        assert back_plan.round == 4 and back_plan.active_groups == plan.active_groups
        assert back_plan.report == ("a",) and back_plan.upload is False
        assert np.array_equal(back_plan.selected, plan.selected)
        assert np.array_equal(back_plan.download_mask(), plan.download_mask())
        assert type(back_plan.download) is type(plan.download)
        assert back.round == 4 and np.array_equal(back.params["fusion"], b.params["fusion"])
        assert back.extras.keys() == b.extras.keys()
        if b.clusters is None:
            assert back.clusters is None
        else:
            for part in ("params", "assignment", "clustered"):
                got = getattr(back.clusters, part)["fusion"]
                want = getattr(clusters, part)["fusion"]
                assert np.array_equal(got, want) and got.dtype == want.dtype
