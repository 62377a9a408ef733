"""Model registry of the torch engine: the names of `dist_dl.train.models`,
built as ``torch.nn.Module``s. Runs inside each worker.

A builder takes ``(input_shape, classes)`` (``input_shape`` as the Keras
registry gives it, ``(height, width, channels)``) and returns a module that
maps float ``[batch, channels, height, width]`` images to logits ``[batch,
classes]`` (no softmax): the training loop puts `Normalize`
in front of it, and the loss and the logged model's softmax come after it.
"""
from __future__ import annotations

import importlib.util
from typing import Callable

from dist_dl.train.models import MODEL_NAMES, call_builder

__all__ = ["build_torch_model", "check_registry_model", "TORCH_MODEL_NAMES"]


def _no_torchvision(why: str) -> ImportError:
    return ImportError(
        f"model 'resnet50' of the torch engine is torchvision's ResNet50, and torchvision "
        f"{why}: pip install torchvision (the build made for this torch), or pass a builder "
        "(input_shape, classes) -> torch.nn.Module")


def check_registry_model(name: str) -> None:
    """On the driver, before workers start: what the registry's model
    ``name`` needs beyond torch is installed (torchvision for ``resnet50``).

    Raises:
        ImportError: it is not, naming what to install.
    """
    if name == "resnet50" and importlib.util.find_spec("torchvision") is None:
        raise _no_torchvision("is not installed here")


def _resnet50(input_shape, classes):
    try:
        from torchvision.models import resnet50
    except ImportError as exc:
        raise _no_torchvision(f"does not import here ({exc})") from exc
    # weights=None: no download, and ImageNet's head would not fit other classes.
    return resnet50(weights=None, num_classes=classes)


def _small_cnn(input_shape, classes):
    """The Keras registry's ``small_cnn`` in torch: three conv-BN-ReLU blocks
    (32, 64, 128 filters; max pooling between them), global average pooling,
    a linear layer. BatchNorm momentum 0.1 is Keras' 0.9 (torch counts the
    new batch's share)."""
    from torch import nn

    layers, channels = [], input_shape[-1]
    for i, filters in enumerate((32, 64, 128)):
        if i:
            layers.append(nn.MaxPool2d(2))
        layers += [nn.Conv2d(channels, filters, 3, padding=1, bias=False),
                   nn.BatchNorm2d(filters, momentum=0.1), nn.ReLU(inplace=True)]
        channels = filters
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)


_REGISTRY: dict[str, Callable] = {"resnet50": _resnet50, "small_cnn": _small_cnn}
TORCH_MODEL_NAMES = tuple(_REGISTRY)
assert set(TORCH_MODEL_NAMES) == set(MODEL_NAMES), "both engines know the same model names"


def build_torch_model(model: str | Callable, input_shape: tuple[int, int, int], classes: int):
    """Build a torch model by registry name, or call a user's builder.

    Raises:
        ValueError: an unknown name; a builder that returns no
            ``torch.nn.Module``, or one whose output has not ``classes``
            units (checked on one image, in eval mode).
    """
    import torch

    built = call_builder(model, _REGISTRY, input_shape, classes, "torch.nn.Module")
    if not isinstance(built, torch.nn.Module):
        raise ValueError(
            f"the model builder returned a {type(built).__module__}.{type(built).__name__}; "
            f"engine='torch' trains a torch.nn.Module: return one from the builder (a Keras model "
            f"trains with engine='horovod' or 'tensorflow')")
    height, width, channels = input_shape
    was_training = built.training
    built.eval()
    with torch.no_grad():
        out = built(torch.zeros(1, channels, height, width))
    built.train(was_training)
    if out.ndim != 2 or out.shape[-1] != classes:
        raise ValueError(f"the model's output has shape {tuple(out.shape)} for one image, and the "
                         f"data has {classes} classes: the builder must end in a layer of "
                         f"{classes} outputs (logits, no softmax)")
    return built
