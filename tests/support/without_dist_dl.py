"""A logged model's predictions from a Python where dist_dl does not import
(as on a serving endpoint that has only the model's own requirements)."""
from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, sys

class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name == "dist_dl" or name.startswith("dist_dl."):
            raise ImportError("dist_dl is not installed here")

sys.meta_path.insert(0, _Blocked())
sys.modules.pop("dist_dl", None)
import mlflow.pyfunc, pandas as pd
blobs = [bytes.fromhex(h) for h in json.load(open(sys.argv[2]))]
result = mlflow.pyfunc.load_model(sys.argv[1]).predict(pd.DataFrame({"image": blobs}))
assert not any(m == "dist_dl" or m.startswith("dist_dl.") for m in sys.modules)
print(json.dumps({"prediction": result["prediction"].tolist(),
                  "probabilities": [list(p) for p in result["probabilities"]]}))
"""


def predict_without_dist_dl(model_dir: str, blobs, folder) -> dict:
    """``{"prediction": [...], "probabilities": [[...], ...]}`` of the MLflow
    model in ``model_dir`` (a local folder) for the encoded images ``blobs``,
    computed in a new Python process that cannot import dist_dl; ``folder``
    (a pathlib.Path) holds the input file and is the process's directory."""
    inputs = folder / "blobs.json"
    inputs.write_text(json.dumps([bytes(b).hex() for b in blobs]))
    done = subprocess.run([sys.executable, "-c", SCRIPT, model_dir, str(inputs)],
                          capture_output=True, text=True, timeout=280, cwd=str(folder))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
