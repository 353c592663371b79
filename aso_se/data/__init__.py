"""The data layer: one ``ClassificationData`` per ``conf/data/<name>.yaml``.

Its docstring has the interface: attributes, ``search_loaders`` (disjoint halves of the training set,
as DARTS) and ``train_loaders``, batch shapes, ``set_epoch``. User errors raise ``DataError`` with one line
(imported from ``aso_se.data.errors`` only, so that it has one import path).
"""
from aso_se.data.base import ClassificationData, LoadedSplits
from aso_se.data.cifar import CIFARData
from aso_se.data.dvs import CIFAR10DVSData, DVSGestureData
from aso_se.data.fashion_mnist import FashionMNISTData
from aso_se.data.image_folder import ImageFolderData
from aso_se.data.mnist5k import MNIST5kData

__all__ = [
    "CIFAR10DVSData",
    "CIFARData",
    "ClassificationData",
    "DVSGestureData",
    "FashionMNISTData",
    "ImageFolderData",
    "LoadedSplits",
    "MNIST5kData",
]
