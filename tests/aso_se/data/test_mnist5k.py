"""The embedded default dataset end to end: real digits, splits, seeding, epochs, shards."""
import pytest
import torch

from aso_se.data import MNIST5kData
from aso_se.data.mnist5k import MNIST_MEAN, MNIST_STD
from tests.aso_se.data.helpers import error_of


def all_batches(loader) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*loader)
    return torch.cat(images), torch.cat(labels)


@pytest.fixture(scope="module")
def mnist5k() -> MNIST5kData:
    return MNIST5kData()


def test_real_digits_in_the_contract_shapes(mnist5k, digits):
    assert (mnist5k.name, mnist5k.num_classes, mnist5k.in_channels, mnist5k.image_size, mnist5k.timesteps) == (
        "mnist5k", 10, 1, 28, None,
    )
    train, test = mnist5k.train_loaders(256, seed=0)
    images, labels = all_batches(test)
    assert images.shape == (1000, 1, 28, 28) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and set(labels.tolist()) == set(range(10))
    # Un-normalized, the pixels are MNIST's: mostly black, a few bright strokes.
    pixels = images * MNIST_STD[0] + MNIST_MEAN[0]
    assert pixels.min() >= -1e-6 and pixels.max() <= 1 + 1e-6
    assert 0.10 < pixels.mean() < 0.16 and 0.5 < (pixels < 0.01).float().mean() < 0.9
    assert images.std(dim=(1, 2, 3)).min() > 0.5  # no constant image
    # Every test image is one of the real digits, with its label.
    raw, raw_labels = torch.from_numpy(digits[0]).float() / 255, torch.from_numpy(digits[1])
    first = (pixels[0, 0] - raw).abs().flatten(1).amax(1).argmin()
    assert torch.allclose(pixels[0, 0], raw[first], atol=1e-5) and labels[0] == raw_labels[first]
    assert len(train.sampler) == 4000


def test_stratified_split_balances_labels_and_is_fixed(mnist5k):
    splits = mnist5k.splits
    assert torch.bincount(splits.train_labels).tolist() == [400] * 10
    assert torch.bincount(splits.test_labels).tolist() == [100] * 10
    train_ids, test_ids = set(splits.train.indices), set(splits.test.indices)
    assert not train_ids & test_ids and len(train_ids | test_ids) == 5000
    # The split depends on split_seed only, never on the run seed.
    assert MNIST5kData().splits.test.indices == splits.test.indices
    assert MNIST5kData(split_seed=1).splits.test.indices != splits.test.indices


def test_search_halves_are_disjoint_balanced_and_cover_the_training_set(mnist5k):
    weights, arch = mnist5k.search_loaders(64, seed=0)
    weights_ids = {index for _, index in weights.sampler}
    arch_ids = {index for _, index in arch.sampler}
    assert len(weights_ids) == len(arch_ids) == 2000 and not weights_ids & arch_ids
    train_labels = mnist5k.splits.train_labels
    for half in (weights_ids, arch_ids):
        assert torch.bincount(train_labels[sorted(half)]).tolist() == [200] * 10
    images, labels = next(iter(weights))
    assert images.shape == (64, 1, 28, 28) and labels.shape == (64,)


def test_same_seed_same_batches_other_seed_other_order(mnist5k):
    first = all_batches(mnist5k.train_loaders(500, seed=3)[0])
    again = all_batches(mnist5k.train_loaders(500, seed=3)[0])
    other = all_batches(mnist5k.train_loaders(500, seed=4)[0])
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])
    assert torch.equal(first[1].sort().values, other[1].sort().values)  # same samples, new order


def test_set_epoch_reorders_and_a_resumed_loader_repeats_it():
    data = MNIST5kData(crop_padding=2, cutout_length=8, max_train_samples=300)
    loader = data.train_loaders(100, seed=0)[0]
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        epochs.append(all_batches(loader))
    assert not torch.equal(epochs[0][1], epochs[1][1])
    resumed = MNIST5kData(crop_padding=2, cutout_length=8, max_train_samples=300).train_loaders(100, seed=0)[0]
    resumed.set_epoch(1)
    images, labels = all_batches(resumed)
    assert torch.equal(labels, epochs[1][1]) and torch.equal(images, epochs[1][0])
    # Resuming in the middle of epoch 1: batches 1 and 2, without loading batch 0.
    resumed.set_epoch(1, start_batch=1)
    assert len(resumed) == 2
    images, labels = all_batches(resumed)
    assert torch.equal(labels, epochs[1][1][100:]) and torch.equal(images, epochs[1][0][100:])


def test_augmentation_is_independent_of_workers_and_leaves_the_global_rng_alone():
    def epoch_one(num_workers: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Epoch 1 of a loader that ran epoch 0 first (so persistent workers are reused)."""
        data = MNIST5kData(crop_padding=2, cutout_length=8, max_train_samples=200, num_workers=num_workers)
        loader = data.train_loaders(50, seed=9)[0]
        for epoch in range(2):
            loader.set_epoch(epoch)
            batches = all_batches(loader)
        return batches

    torch.manual_seed(0)
    expected_draw = torch.rand(3)
    torch.manual_seed(0)
    in_process = epoch_one(num_workers=0)
    assert torch.equal(torch.rand(3), expected_draw)
    with_workers = epoch_one(num_workers=2)
    assert torch.equal(in_process[0], with_workers[0]) and torch.equal(in_process[1], with_workers[1])
    # Augmentation really ran: cutout zeroed squares in the normalized images.
    assert ((in_process[0] == 0).flatten(1).sum(1) >= 16).all()


@pytest.mark.parametrize("world_size", [2, 3])
def test_rank_shards_are_disjoint_and_equal(mnist5k, world_size):
    shards = [mnist5k.search_loaders(32, seed=1, rank=r, world_size=world_size)[0] for r in range(world_size)]
    ids = [{index for _, index in shard.sampler} for shard in shards]
    assert len({len(shard) for shard in shards}) == 1  # same number of steps on every rank
    assert sum(map(len, ids)) == len(set().union(*ids)) == 2000 - 2000 % world_size
    tests = [mnist5k.train_loaders(64, seed=1, rank=r, world_size=world_size)[1] for r in range(world_size)]
    assert sum(len(all_batches(t)[1]) for t in tests) == 1000  # every test image once


def test_caps_take_stratified_subsets():
    data = MNIST5kData(max_train_samples=250, max_test_samples=30)
    train, test = data.train_loaders(64, seed=0)
    train_labels = all_batches(train)[1]
    assert len(train_labels) == 250 and torch.bincount(train_labels).tolist() == [25] * 10
    assert torch.bincount(all_batches(test)[1]).tolist() == [3] * 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"test_fraction": 1.5}, "data.test_fraction=1.5 is invalid; expected a number between 0 and 1, e.g. 0.2"),
        ({"num_workers": -1}, "data.num_workers=-1 is invalid; expected an integer >= 0"),
        ({"max_train_samples": 0}, "data.max_train_samples=0 is invalid; expected an integer >= 1 or null"),
        ({"cutout_length": 2.5}, "data.cutout_length=2.5 is invalid; expected an integer >= 0"),
    ],
)
def test_bad_arguments_name_the_key(kwargs, message):
    assert error_of(lambda: MNIST5kData(**kwargs)) == message


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"batch_size": 0, "seed": 0}, "batch_size=0 is invalid; expected an integer >= 1"),
        ({"batch_size": 8, "seed": -1}, "seed=-1 is invalid; expected an integer >= 0"),
        (
            {"batch_size": 8, "seed": 0, "rank": 2, "world_size": 2},
            "rank=2 is invalid for world_size=2; expected 0 <= rank < world_size",
        ),
    ],
)
def test_bad_loader_calls_name_the_argument(mnist5k, call, message):
    assert error_of(lambda: mnist5k.train_loaders(**call)) == message


def test_too_few_samples_for_the_processes():
    data = MNIST5kData(max_train_samples=3)
    assert error_of(lambda: data.train_loaders(8, seed=0, rank=0, world_size=4)) == (
        "mnist5k: 3 images cannot be shared by 4 processes; "
        "fix: raise data.max_train_samples/max_test_samples or use fewer processes"
    )


def test_bad_start_batch(mnist5k):
    loader = mnist5k.search_loaders(8, seed=0)[0]
    message = error_of(lambda: loader.set_epoch(0, start_batch=-1))
    assert message == "start_batch=-1 is invalid; expected an integer >= 0"
