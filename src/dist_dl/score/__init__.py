"""Batch scoring of a Spark DataFrame of images with a logged MLflow model:
built on the driver, run on the executors."""
from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "score_dataframe": "dist_dl.score.dataframe",
}

__all__ = ["score_dataframe"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
