"""See the package docstring: names streaming imports, unusable."""
from torchvision import _unavailable as to_tensor  # noqa: F401
