"""Batch scoring of a Spark DataFrame of images with a logged MLflow model:
built on the driver, run on the executors."""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "score_dataframe": "dist_dl.score.dataframe",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.score.dataframe import score_dataframe  # noqa: F401

__all__ = ["score_dataframe"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
