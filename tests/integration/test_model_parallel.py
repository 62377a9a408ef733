"""split_model on two logical CPU devices: same outputs and gradients as unsplit.

The logical devices must be configured before TensorFlow initialises its
devices, which other tests in this process may already have done, so the
check runs in a fresh interpreter.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dist_dl.core import compat

pytestmark = [pytest.mark.needs("tensorflow"), pytest.mark.profile_subset_164]

_CHECK = r'''
import json
import numpy as np
from dist_dl.core import compat
from dist_dl.train.model_parallel import split_cpu, split_model

devices = split_cpu(2)  # before anything else touches TensorFlow
import tensorflow as tf
keras = compat.keras()

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.layers.Conv2D(4, 3, activation="relu", input_shape=(8, 8, 1)),
    keras.layers.Flatten(),
    keras.layers.Dense(32, activation="tanh"),
    keras.layers.Dense(16, activation="relu"),
    keras.layers.Dense(3),
])
split = split_model(model, devices)
x = tf.random.normal((6, 8, 8, 1))
y = tf.random.normal((6, 3))


def loss_and_grads(m):
    with tf.GradientTape() as tape:
        out = m(x, training=True)
        loss = tf.reduce_mean((out - y) ** 2)
    return out, tape.gradient(loss, m.trainable_variables)


def diff(a, b):
    return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in zip(a, b))


out0, grads0 = loss_and_grads(model)
out1, grads1 = loss_and_grads(split)                  # eager
out2, grads2 = tf.function(loss_and_grads)(split)     # traced, as Keras fit runs it

# Where the work ran: the cut activation's device and each gradient's.
first = split.groups[0]
act = x
with tf.device(devices[0]):
    for layer in first:
        act = layer(act)

# One step of fit on both models (same optimizer): same weights after.
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
split.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.fit(x, y, batch_size=6, epochs=1, verbose=0, shuffle=False)
split.fit(x, y, batch_size=6, epochs=1, verbose=0, shuffle=False)

print("RESULT " + json.dumps({
    "devices": devices,
    "groups": [len(g) for g in split.groups],
    "n_vars": [len(model.trainable_variables), len(split.trainable_variables)],
    "out_eager": diff([out0], [out1]), "out_graph": diff([out0], [out2]),
    "grad_eager": diff(grads0, grads1), "grad_graph": diff(grads0, grads2),
    "var_devices": [v.device for v in split.trainable_variables],
    "grad_devices": [g.device for g in grads1],
    "act_device": act.device,
    "after_fit": diff(model.get_weights(), split.get_weights()),
}))
'''


@pytest.mark.timeout(180)
def test_split_model_on_two_logical_cpus_matches_unsplit():
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True,
                          text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    r = json.loads(line[len("RESULT "):])

    assert r["devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert len(r["groups"]) == 2 and sum(r["groups"]) == 5
    assert r["n_vars"][0] == r["n_vars"][1] == 8
    # Same outputs and gradients (eager: bit for bit; traced: float32 rounding).
    assert r["out_eager"] == 0 and r["grad_eager"] == 0
    assert r["out_graph"] < 1e-5 and r["grad_graph"] < 1e-5
    assert r["after_fit"] < 1e-5
    # Weights and their gradients live on the group's device; the cut
    # activation is produced on the first device and consumed on the second.
    first = sum(1 for d in r["var_devices"] if d.endswith("CPU:0"))
    assert 0 < first < 8
    assert all(d.endswith("CPU:0") for d in r["var_devices"][:first])
    assert all(d.endswith("CPU:1") for d in r["var_devices"][first:])
    assert [d[-5:] for d in r["grad_devices"]] == [d[-5:] for d in r["var_devices"]]
    assert r["act_device"].endswith("CPU:0")


def test_split_model_rejects_what_it_cannot_split():
    keras = compat.keras()

    from dist_dl.train.model_parallel import split_model

    inp = keras.Input((4,))
    a, b = keras.layers.Dense(2)(inp), keras.layers.Dense(2)(inp)
    branched = keras.Model(inp, keras.layers.Add()([a, b]))
    with pytest.raises(ValueError, match="chain of layers"):
        split_model(branched, ["/CPU:0"])
    seq = keras.Sequential([keras.layers.Dense(2, input_shape=(4,))])
    with pytest.raises(ValueError, match="does not exist here"):
        split_model(seq, ["/GPU:7"])
    with pytest.raises(ValueError, match="cannot fill 2 devices"):
        split_model(seq, ["/CPU:0", "/CPU:0"])
