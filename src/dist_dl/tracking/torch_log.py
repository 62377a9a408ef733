"""Logging a torch image classifier to MLflow (rank 0 of the torch engine).

Two models go into the run:

- ``model``: the library's pyfunc (`TorchImageClassifier`),
  which scores encoded images; what ``TrainedModel.transform`` and
  ``score_dataframe`` load. It holds a ``torch.export`` program of
  ``Normalize`` and the network (float32, CPU), so it loads where neither
  dist_dl nor the network's code is installed (torch, Pillow, numpy, pandas
  and MLflow are enough).
- ``pytorch_model``: the network alone in MLflow's pytorch flavour
  (``mlflow.pytorch.load_model``: the ``nn.Module``, float32 images
  normalised as `Normalize` does), for
  fine-tuning and for code of one's own; loading it needs the code of the
  network's classes (torchvision for ``resnet50``).
"""
from __future__ import annotations

import copy
import os
import tempfile
import warnings
from typing import Sequence

__all__ = ["log_torch_classifier", "torch_pip_requirements", "PYTORCH_MODEL"]

PYTORCH_MODEL = "pytorch_model"


def torch_pip_requirements() -> list[str]:
    """What the logged models need to load, pinned to what runs here."""
    from importlib import metadata

    requirements = []
    for name in ("torch", "torchvision", "pillow", "simplejpeg", "numpy", "pandas",
                 "cloudpickle"):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        # A local build tag (2.13.0+cpu, +cu130) is not on PyPI.
        requirements.append(f"{name}=={version.split('+')[0]}")
    return requirements


def _pickled_by_value():
    """The pyfunc classes and the decoder they call travel inside the logged
    model, so it loads without dist_dl."""
    from dist_dl.read import augment, imaging
    from dist_dl.tracking import pyfunc, torch_pyfunc
    from dist_dl.tracking.log import pickled_by_value

    return pickled_by_value(torch_pyfunc, pyfunc, imaging, augment)


def export_program(net, normalize, image_size: int):
    """``Normalize`` then ``net`` (a float32 CPU copy in eval mode, which the
    program shares), exported with a dynamic batch size (``torch.export``)."""
    import torch

    serving = torch.nn.Sequential(copy.deepcopy(normalize).to("cpu"), net)
    serving = serving.to(memory_format=torch.contiguous_format).eval()
    example = torch.zeros((2, 3, image_size, image_size), dtype=torch.uint8)
    batch = torch.export.Dim("batch", min=2)
    return torch.export.export(serving, (example,), dynamic_shapes=({0: batch},))


def log_torch_classifier(net, normalize, *, image_size: int, crop_fraction: float,
                         class_names: Sequence[str], image_col: str = "image",
                         registered_model_name: str | None = None,
                         artifact_path: str = "model", batch_size: int = 64):
    """Log ``net`` (logits out, float images in) with ``normalize`` in front,
    into the active run, as the two models of the module's notes; register
    ``model`` under ``registered_model_name`` if given.

    Returns:
        The `LoggedModel` of the pyfunc model.
    """
    import mlflow
    import mlflow.pytorch

    from dist_dl.core import compat
    from dist_dl.tracking.log import classifier_signature, logged_model
    from dist_dl.tracking.torch_pyfunc import TORCH_ARTIFACT, TorchImageClassifier

    import torch

    requirements = torch_pip_requirements()
    python_model = TorchImageClassifier(image_size=image_size, crop_fraction=crop_fraction,
                                        image_col=image_col, class_names=class_names,
                                        batch_size=batch_size)
    signature = classifier_signature(image_col)
    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("log_torch_classifier logs into the active MLflow run: start one")
    cpu_net = copy.deepcopy(net).to("cpu", torch.float32).eval()
    with tempfile.TemporaryDirectory(prefix="dist_dl-model-") as tmp:
        program = os.path.join(tmp, "model.pt2")
        torch.export.save(export_program(cpu_net, normalize, image_size), program)
        with _pickled_by_value(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*input example was not provided")
            info = mlflow.pyfunc.log_model(
                **compat.model_name_argument(artifact_path), python_model=python_model,
                artifacts={TORCH_ARTIFACT: program}, signature=signature,
                pip_requirements=requirements, registered_model_name=registered_model_name,
                metadata={"image_size": image_size, "crop_fraction": crop_fraction,
                          "image_col": image_col, "class_names": python_model.class_names,
                          "engine": "torch"})
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*input example was not provided")
            mlflow.pytorch.log_model(cpu_net, **compat.model_name_argument(PYTORCH_MODEL),
                                     pip_requirements=requirements)
    return logged_model(info, run.info.run_id, artifact_path, registered_model_name)
