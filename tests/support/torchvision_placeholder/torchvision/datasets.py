"""See the package docstring: names streaming imports, unusable."""
from torchvision import _unavailable


class VisionDataset:
    def __init__(self, *args, **kwargs):
        _unavailable()


CIFAR10 = VisionDataset
