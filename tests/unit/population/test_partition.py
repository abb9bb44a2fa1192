"""The clustered benchmark's data and partition: label groups that conflict on every class, a
grouped partition that gives each device one group's samples, the group in devices.parquet."""

import numpy as np
import pytest

from raymm.config.schema import PartitionSpec, PopulationSpec
from raymm.data import load_dataset
from raymm.data.synthetic import group_labels
from raymm.driver.summary import devices_table
from raymm.errors import ScenarioError
from raymm.population.devices import build_population
from raymm.population.partition import device_groups

PARAMS = {"n_train": 1200, "n_test": 40, "classes": 8}


@pytest.fixture(scope="module")
def grouped():
    return load_dataset("synthetic", {**PARAMS, "groups": 4}, 3)


def test_groups_disagree_on_every_class():
    y = np.arange(8)
    labels = [group_labels(y, np.full(8, g), 8, 4) for g in range(4)]
    for g in range(4):
        assert sorted(labels[g].tolist()) == list(range(8))   # a permutation
        for h in range(g):
            assert (labels[g] != labels[h]).all()


def test_groups_keep_the_inputs_and_shift_the_labels(grouped):
    plain = load_dataset("synthetic", PARAMS, 3)
    assert plain.train.group is None
    for m in plain.sensors:
        assert np.array_equal(plain.train.x[m], grouped.train.x[m])
    g = grouped.train.group
    assert set(np.unique(g).tolist()) == {0, 1, 2, 3}
    assert np.array_equal(grouped.train.y, (plain.train.y + 2 * g) % 8)


def test_more_groups_than_classes_is_refused():
    with pytest.raises(Exception, match="groups"):
        load_dataset("synthetic", {**PARAMS, "groups": 9}, 0)


def test_grouped_partition_gives_each_device_one_group(grouped):
    spec = PopulationSpec(devices=10, partition=PartitionSpec(kind="grouped", alpha=1.0,
                                                              min_samples=20))
    pop = build_population(spec, grouped, 0)
    assert pop.data_group.tolist() == device_groups(10, 4).tolist() == \
        [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    for d in range(pop.n):
        assert (grouped.train.group[pop.indices(d)] == pop.data_group[d]).all()
        assert pop.indices(d).shape[0] >= 20
    held = np.concatenate([pop.indices(d) for d in range(pop.n)])
    assert np.unique(held).shape[0] == held.shape[0] == 1200   # every sample, once
    again = build_population(spec, grouped, 0)
    assert np.array_equal(pop.data_indices, again.data_indices)
    assert devices_table(pop).column("group").to_pylist() == pop.data_group.tolist()


def test_grouped_partition_needs_groups():
    plain = load_dataset("synthetic", PARAMS, 3)
    spec = PopulationSpec(devices=4, partition=PartitionSpec(kind="grouped"))
    with pytest.raises(ScenarioError, match="grouped needs a dataset with groups"):
        build_population(spec, plain, 0)


def test_other_partitions_record_no_group(grouped):
    pop = build_population(PopulationSpec(devices=4), grouped, 0)
    assert pop.data_group is None
    assert "group" not in devices_table(pop).column_names
