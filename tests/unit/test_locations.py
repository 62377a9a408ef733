"""Locations as files, Spark URLs and tracking URIs: workers and Spark tasks
run in other working directories, so nothing relative may reach them."""
import os

import pytest

from dist_dl.core.locations import file_path, file_url, is_remote, local_path, spark_path
from dist_dl.tracking.target import absolute_tracking_uri


def test_local_and_dbfs_paths_become_absolute_and_remote_urls_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert local_path("runs/x") == str(tmp_path / "runs" / "x")
    assert local_path("file:///data/x") == "/data/x" and local_path("dbfs:/ml/x") == "/dbfs/ml/x"
    assert spark_path("runs/x") == f"file://{tmp_path}/runs/x"
    assert spark_path("dbfs:/ml/x") == "dbfs:/ml/x"
    assert spark_path("abfss://c@a.dfs.core.windows.net/x") == "abfss://c@a.dfs.core.windows.net/x"
    assert is_remote("s3://b/k") and not is_remote("file:///x") and not is_remote("/x")
    with pytest.raises(ValueError, match="checkpoint_dir 's3://b/k' must be a file-system path"):
        local_path("s3://b/k", "checkpoint_dir")


def test_file_paths_and_urls_of_local_locations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert file_url("runs/x") == f"file://{tmp_path}/runs/x" == spark_path("runs/x")
    assert file_path(file_url("runs/x")) == str(tmp_path / "runs" / "x")
    assert file_path("file:/data/x") == "/data/x" and file_path("dbfs:/ml/x") == "/dbfs/ml/x"
    assert file_path("s3://b/k") is None and file_path("abfss://c@a.dfs.core.windows.net/x") is None


def test_tracking_uris_of_local_stores_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_tracking_uri("runs/mlruns") == f"file://{tmp_path}/runs/mlruns"
    assert absolute_tracking_uri("file:runs/mlruns") == f"file://{tmp_path}/runs/mlruns"
    # MLflow 3's default store (from 3.7 on), relative to the working directory.
    assert absolute_tracking_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    for kept in ("file:///abs/mlruns", "databricks", "databricks-uc", "databricks://profile",
                 "sqlite:////abs/x.db", "sqlite://", "http://mlflow:5000", None):
        assert absolute_tracking_uri(kept) == kept
    assert os.path.isabs(absolute_tracking_uri("/abs/mlruns")[len("file://"):])


@pytest.mark.timeout(30)
def test_store_folder_of_each_kind_of_mlflow_store(tmp_path):
    from dist_dl.tracking.target import store_folder

    assert store_folder((tmp_path / "mlruns").as_uri()) == (tmp_path / "mlruns").as_uri()
    assert store_folder(f"sqlite:///{tmp_path}/mlflow.db") == str(tmp_path)
    assert store_folder("sqlite:///runs/mlflow.db") == os.path.abspath("runs")
    assert store_folder("databricks") is None and store_folder("http://tracking:5000") is None
