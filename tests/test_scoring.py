"""Scoring a Spark DataFrame of JPEG bytes on the executors with a logged model."""
from __future__ import annotations

import io

import mlflow
import numpy as np
import pandas as pd
import pytest

from dist_dl import compat
from dist_dl.score import score_dataframe
from dist_dl.tracking import ImagePreprocessing, log_keras_classifier

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
