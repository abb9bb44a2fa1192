"""The vectorised seed derivation is NumPy's SeedSequence, word for word."""

import numpy as np
import pytest

from raymm import seeding


@pytest.mark.parametrize("seed", [0, 1, 2**31, 2**32 - 1, 2**32, 2**40 + 5, 2**64 + 3])
@pytest.mark.parametrize("rnd", [seeding.SETUP, 0, 7, 2**33])
def test_torch_seeds_match_seedsequence(seed: int, rnd: int) -> None:
    devices = np.concatenate([[seeding.SERVER, 0, 1, 2**32 - 2],
                              np.random.default_rng(seed % 97).integers(0, 10**7, 40)])
    for purpose in ("batches", "data_augment"):
        want = [seeding.torch_seed(seed, rnd, int(d), purpose) for d in devices]
        assert seeding.torch_seeds(seed, rnd, devices, purpose) == want


def test_torch_seeds_of_huge_device_ids_fall_back() -> None:
    devices = np.array([2**32 - 1, 2**35])
    assert seeding.torch_seeds(3, 1, devices, "batches") == [
        seeding.torch_seed(3, 1, int(d), "batches") for d in devices]


def test_seeds_differ_by_every_part_of_the_name() -> None:
    base = seeding.torch_seeds(0, 1, np.array([5]), "batches")
    assert base != seeding.torch_seeds(1, 1, np.array([5]), "batches")
    assert base != seeding.torch_seeds(0, 2, np.array([5]), "batches")
    assert base != seeding.torch_seeds(0, 1, np.array([6]), "batches")
    assert base != seeding.torch_seeds(0, 1, np.array([5]), "data_augment")
