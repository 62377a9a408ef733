"""Batch scoring of a Spark DataFrame of images with a logged MLflow model:
built on the driver, run on the executors."""
from dist_dl.score.dataframe import score_dataframe

__all__ = ["score_dataframe"]
