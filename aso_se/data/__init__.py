"""The data layer: one object per ``conf/data/<name>.yaml``, each a ``ClassificationData``.

Attributes ``name, num_classes, in_channels, image_size, timesteps`` and two loader factories:
``search_loaders(batch_size, *, seed, rank=0, world_size=1) -> (weights_loader, arch_loader)``
(disjoint halves of the training set, as DARTS) and ``train_loaders(...) -> (train, test)``.
Loaders yield ``(inputs, labels)``; ``set_epoch(epoch)`` makes a pass a pure function of
(seed, epoch). Inputs are ``[B, C, H, W]`` for static images (``timesteps`` is None: the model
repeats them over T, direct encoding) and time-first ``[T, B, 2, H, W]`` for DVS frames (the
loader's collate transposes). User errors raise ``DataError`` with one line.
"""
from aso_se.data.base import ClassificationData, LoadedSplits
from aso_se.data.cifar import CIFARData
from aso_se.data.dvs import CIFAR10DVSData, DVSGestureData
from aso_se.data.errors import DataError
from aso_se.data.fashion_mnist import FashionMNISTData
from aso_se.data.image_folder import ImageFolderData
from aso_se.data.mnist5k import MNIST5kData

__all__ = [
    "CIFAR10DVSData",
    "CIFARData",
    "ClassificationData",
    "DVSGestureData",
    "DataError",
    "FashionMNISTData",
    "ImageFolderData",
    "LoadedSplits",
    "MNIST5kData",
]
