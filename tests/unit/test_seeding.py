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


def test_seed_global_draws_what_torch_manual_seed_draws() -> None:
    """The sequential path seeds a module's own randomness (a user's dropout) with
    `seeding.seed_global`: the same draws as after `torch.manual_seed`, whatever was drawn
    before."""
    import torch

    for seed in (0, 7, 2**40 + 3):
        torch.rand(5)
        seeding.seed_global(seed)
        ours = (torch.rand(4), torch.randn(3), torch.randperm(9))
        torch.rand(2)
        torch.manual_seed(seed)
        theirs = (torch.rand(4), torch.randn(3), torch.randperm(9))
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b)
