"""Stratified order, seed derivation and per-rank shards, on MNIST-5k's real labels."""
import numpy as np
import pytest
import torch

from aso_se.data.sampling import ShardSampler, derive_seed, stratified_order


@pytest.fixture(scope="module")
def unbalanced_labels(digits) -> torch.Tensor:
    """Real labels with unequal classes: class c keeps 20 + 13·c samples, in shuffled order."""
    labels = torch.from_numpy(digits[1])
    kept = torch.cat([torch.nonzero(labels == c).flatten()[: 20 + 13 * c] for c in range(10)])
    return labels[kept[torch.randperm(len(kept), generator=torch.Generator().manual_seed(3))]]


def test_stratified_order_is_a_seeded_permutation(unbalanced_labels):
    order = stratified_order(unbalanced_labels, seed=5)
    assert torch.equal(order.sort().values, torch.arange(len(unbalanced_labels)))
    assert torch.equal(order, stratified_order(unbalanced_labels, seed=5))
    assert not torch.equal(order, stratified_order(unbalanced_labels, seed=6))


@pytest.mark.parametrize("size", [1, 10, 57, 200, 401])
def test_every_prefix_keeps_the_class_proportions(unbalanced_labels, size):
    order = stratified_order(unbalanced_labels, seed=0)
    totals = torch.bincount(unbalanced_labels, minlength=10).double()
    counts = torch.bincount(unbalanced_labels[order[:size]], minlength=10).double()
    assert (counts - totals * size / len(unbalanced_labels)).abs().max() <= 1.0


def test_derive_seed_separates_parts():
    seeds = {derive_seed(0, 1), derive_seed(1, 0), derive_seed(0, 1, 0), derive_seed(0, "test split")}
    assert len(seeds) == 4
    assert derive_seed(7, 2) == derive_seed(7, 2) == derive_seed(7, np.int64(2))
    assert all(0 <= seed < 2**64 for seed in seeds)
    torch.Generator().manual_seed(max(seeds))  # any derived seed is a valid torch seed


def keys(sampler: ShardSampler) -> list[int]:
    return [index for _epoch, index in sampler]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_training_shards_are_disjoint_equal_and_reshuffled(world_size):
    indices = torch.arange(100, 201)  # 101 samples: not divisible by 2 or 3
    shards = [ShardSampler(indices, seed=4, rank=r, world_size=world_size, shuffle=True) for r in range(world_size)]
    taken = [keys(shard) for shard in shards]
    assert all(len(t) == 101 // world_size == len(shard) for t, shard in zip(taken, shards))
    union = set().union(*map(set, taken))
    assert len(union) == sum(map(len, taken)) and union <= set(indices.tolist())
    for shard in shards:
        shard.set_epoch(1)
    assert [keys(shard) for shard in shards] != taken
    assert all(epoch == 1 for epoch, _ in shards[0])


def test_evaluation_shards_cover_every_sample_once_in_order():
    indices = torch.arange(10, 21)
    shards = [ShardSampler(indices, seed=0, rank=r, world_size=3, shuffle=False) for r in range(3)]
    taken = [keys(shard) for shard in shards]
    assert [len(shard) for shard in shards] == [4, 4, 3]
    assert sorted(sum(taken, [])) == indices.tolist()
    assert taken[0] == [10, 13, 16, 19]

