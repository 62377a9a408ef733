"""Scoring a Spark DataFrame of JPEG bytes on the executors with a logged model."""
from __future__ import annotations

import glob
import io
import os
import re

import mlflow
import numpy as np
import pandas as pd
import pytest

from dist_dl.core import compat
from dist_dl.score import score_dataframe
from dist_dl.tracking import ImagePreprocessing, log_keras_classifier

pytestmark = [pytest.mark.needs("tensorflow"), pytest.mark.profile_subset_164]

SPEC = ImagePreprocessing(image_size=16, channels=3, mean=0.5, std=0.25)


def _jpegs(count: int):
    from PIL import Image
    from sklearn.datasets import load_digits

    blobs = []
    for pixels in load_digits().images[:count]:
        img = Image.fromarray((pixels * 255 / 16).astype("uint8"), mode="L").convert("RGB")
        buffer = io.BytesIO()
        img.resize((20, 20), Image.NEAREST).save(buffer, format="JPEG", quality=90)
        blobs.append(buffer.getvalue())
    return blobs


@pytest.fixture(scope="module")
def logged_model(tmp_path_factory):
    keras = compat.keras()

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri((tmp_path_factory.mktemp("mlflow") / "mlruns").as_uri())
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input(SPEC.input_shape),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    try:
        # The model reads column "image"; the DataFrame below calls it "jpeg".
        yield log_keras_classifier(model, SPEC).model_uri
    finally:
        mlflow.set_tracking_uri(previous)


@pytest.mark.timeout(240)
def test_executors_predict_like_the_driver(spark, logged_model):
    blobs = _jpegs(30)
    df = spark.createDataFrame(pd.DataFrame({"id": range(len(blobs)), "jpeg": blobs})).repartition(3)
    scored = score_dataframe(df, logged_model, image_col="jpeg", batch_size=4,
                             probabilities_col="probabilities")
    assert scored.columns == ["id", "jpeg", "prediction", "probability", "probabilities"]
    rows = scored.drop("jpeg").toPandas().sort_values("id")
    assert len(rows) == len(blobs)  # nothing dropped

    expected = mlflow.pyfunc.load_model(logged_model).predict(pd.DataFrame({"image": blobs}))
    np.testing.assert_array_equal(rows["prediction"].to_numpy(), expected["prediction"].to_numpy())
    np.testing.assert_allclose(rows["probability"], expected["probability"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack(rows["probabilities"]), np.stack(expected["probabilities"]),
                               rtol=1e-5, atol=1e-6)
    # The executors unpacked the model where Spark keeps this application's
    # files (removed when the application ends), not in the temporary folder.
    from pyspark import SparkFiles
    assert glob.glob(os.path.join(SparkFiles.getRootDirectory(), "dist_dl-model-*", "MLmodel"))


def test_missing_image_column_names_it_and_the_columns(spark, logged_model):
    df = spark.createDataFrame(pd.DataFrame({"id": [1], "img_bytes": [b"x"]}))
    with pytest.raises(ValueError, match=r"'jpeg' is not a column.*\['id', 'img_bytes'\]"):
        score_dataframe(df, logged_model, image_col="jpeg")


def test_wrong_type_and_clashing_output_column_are_errors(spark, logged_model):
    df = spark.createDataFrame(pd.DataFrame({"path": ["a.jpg"], "image": [b"x"],
                                             "prediction": [0]}))
    with pytest.raises(ValueError, match="'path' must be binary.*string"):
        score_dataframe(df, logged_model, image_col="path")
    with pytest.raises(ValueError, match="'prediction' already exists"):
        score_dataframe(df, logged_model, image_col="image")


@pytest.mark.timeout(240)
def test_images_that_cannot_be_scored_get_null_and_a_reason_or_a_named_error(
        spark, logged_model, scenario):
    s = scenario("F10a local", "image that cannot be scored",
                 "score_dataframe over 40 rows in 2 partitions, 4 of them not images (a "
                 "truncated JPEG, random bytes, an empty value, a null), with on_error='null' "
                 "and with the default on_error='raise'",
                 "'null': only those rows get a null prediction, with a reason; every other "
                 "row is scored as the model on the driver scores it; 'raise': the job fails "
                 "naming the partition, the row and why; no row dropped")
    from pyspark.sql import types as T

    blobs = _jpegs(40)
    bad = {5: blobs[5][:40], 17: b"not an image at all", 30: b"", 33: None}
    images = [bad.get(i, blob) for i, blob in enumerate(blobs)]
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("jpeg", T.BinaryType())])
    df = spark.createDataFrame(list(zip(range(40), images)), schema).coalesce(2)
    scored = score_dataframe(df, logged_model, image_col="jpeg", batch_size=8, on_error="null",
                             error_col="why", probabilities_col="probabilities")
    assert [f.name for f in scored.schema.fields][-1] == "why"
    rows = scored.drop("jpeg").toPandas().sort_values("id").set_index("id")
    assert len(rows) == 40
    failed = rows[rows["why"].notna()]
    assert sorted(failed.index) == sorted(bad), failed
    assert failed["prediction"].isna().all() and failed["probability"].isna().all()
    assert failed["probabilities"].isna().all()
    assert "cannot be decoded" in failed.loc[17, "why"], failed.loc[17, "why"]
    assert "empty" in failed.loc[30, "why"] and "null" in failed.loc[33, "why"], failed["why"]
    good = [i for i in range(40) if i not in bad]
    expected = mlflow.pyfunc.load_model(logged_model).predict(
        pd.DataFrame({"image": [blobs[i] for i in good]}))
    np.testing.assert_array_equal(rows.loc[good, "prediction"].astype("int64").to_numpy(),
                                  expected["prediction"].to_numpy())
    np.testing.assert_allclose(rows.loc[good, "probability"].to_numpy(),
                               expected["probability"].to_numpy(), rtol=1e-5, atol=1e-6)
    s.figure(f"on_error='null': {len(failed)} of 40 rows null with reasons, e.g. "
             f"{failed.loc[17, 'why'][:120]!r}; the other {len(good)} as on the driver")

    with pytest.raises(Exception) as info:
        score_dataframe(df, logged_model, image_col="jpeg", batch_size=8).collect()
    text = str(info.value)
    assert re.search(r"cannot score row \d+ of partition \d of column 'jpeg': image", text), \
        text[-3000:]
    assert "on_error='null'" in text
    s.figure("on_error='raise': " + re.search(r"cannot score row [^\n]{0,200}", text).group(0))


class _Refuses:
    """A model (pyfunc's ``predict``) that refuses the rows whose image is
    ``b"bad"`` as the logged classifier does (ValueError), and counts calls."""

    def __init__(self):
        self.calls = 0

    def predict(self, frame):
        self.calls += 1
        if (frame["image"] == b"bad").any():
            raise ValueError("in column 'image', batch starting at row 0: image 0 cannot be "
                             "decoded: not an image")
        return pd.DataFrame({"prediction": [1] * len(frame), "probability": [0.5] * len(frame),
                             "probabilities": [[0.5, 0.5]] * len(frame)}, index=frame.index)


def test_rows_the_model_refuses_are_found_in_a_few_calls_each():
    """A batch the model refuses is halved until each refused row stands
    alone: two bad rows of 256 cost about 2 x 2 x log2(256) calls, not one
    per row; the others keep their outputs, in order; without an error
    column the first bad row fails the task, named by its place."""
    from dist_dl.score._executor import _scored

    images = [b"bad" if i in (7, 200) else b"ok" for i in range(256)]
    frame = pd.DataFrame({"image": images}, index=range(1000, 1256))
    model = _Refuses()
    out = _scored(model, frame, 512, "jpeg", "why")
    assert list(out.index) == list(frame.index)
    refused = out[out["error"].notna()]
    assert list(refused.index) == [1007, 1200] and refused["prediction"].isna().all()
    assert refused["error"].str.contains("cannot be decoded").all(), refused["error"]
    assert (out.drop(refused.index)["prediction"] == 1).all()
    assert model.calls <= 1 + 2 * 2 * 8, model.calls

    with pytest.raises(ValueError, match=r"cannot score row 519 of column 'jpeg': image cannot be "
                                         r"decoded.*on_error='null'"):
        _scored(_Refuses(), frame, 512, "jpeg", None)


def test_on_error_and_error_col_are_checked_on_the_driver(spark, logged_model):
    df = spark.createDataFrame(pd.DataFrame({"image": [b"x"], "why": ["y"]}))
    with pytest.raises(ValueError, match=r"on_error must be one of \('raise', 'null'\).*'skip'"):
        score_dataframe(df, logged_model, image_col="image", on_error="skip")
    with pytest.raises(ValueError, match="'why' already exists.*error_col"):
        score_dataframe(df, logged_model, image_col="image", on_error="null", error_col="why")
