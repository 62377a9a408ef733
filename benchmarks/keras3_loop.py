"""Probe: a Keras 3 model trained with a custom loop under
MultiWorkerMirroredStrategy (the route left for Keras 3 on the tf.distribute
engine, since Keras 3's ``fit`` fails under the strategy: keras-team/keras
issue 20585). Not a library path yet; benchmarks/RESULTS.md ("Keras 3 with a
custom training loop under MultiWorkerMirroredStrategy") has what it measured.

Run two workers on this machine and compare their weights (on runtime 17.3's
or 16.4's stack, where `tf.keras` is Keras 3):

    .venv-dbr-17.3-ml/bin/python benchmarks/keras3_loop.py pair /tmp/k3/run
    STEPS=20 .venv-dbr-17.3-ml/bin/python benchmarks/keras3_loop.py single 0 - /tmp/k3/one
    # then: the max difference between /tmp/k3/run.w0.npy and /tmp/k3/one.w0.npy

usage: keras3_loop.py pair <out_prefix>          (both workers, then their weights compared)
       keras3_loop.py multi <index> <port0,port1> <out_prefix>
       keras3_loop.py single 0 - <out_prefix>    (one process on the global batch)
env knobs:
  MODEL=conv|bn|syncbn|resnet   STEPS=N   OPT=sgd|adam   MP=1 (mixed_float16 + LossScaleOptimizer)
  AGREE=1 (the library's scaler: the overflow check all-reduced)   SHOW_FINITE=1 (print each worker's overflow check)
  SAVE=path.keras (rank 0 saves there, others to a temp path)   LOAD=path.keras (start from saved model)
  GB=global batch (default 16)   HALF=1 (single: worker 0's half only: the no-all-reduce control)
"""
import json, os, sys, time, tempfile
import numpy as np

if sys.argv[1] == "pair":
    # Two workers with free ports, then their final weights compared.
    import socket
    import subprocess

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    out = sys.argv[2]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    ports = f"{free_port()},{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    procs = [subprocess.Popen([sys.executable, __file__, "multi", str(i), ports, out], env=env)
             for i in (0, 1)]
    codes = [p.wait(timeout=900) for p in procs]
    a, b = np.load(f"{out}.w0.npy"), np.load(f"{out}.w1.npy")
    print(f"[pair] exit codes {codes}; {a.size} weights; max abs difference between the "
          f"workers {np.abs(a - b).max():.3g}; identical {np.array_equal(a, b)}")
    sys.exit(max(codes))

import faulthandler
if os.environ.get("DUMP_AFTER"):
    faulthandler.dump_traceback_later(int(os.environ["DUMP_AFTER"]), exit=True)

os.environ.pop("TF_USE_LEGACY_KERAS", None)
mode, index, ports, out = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
if mode == "multi":
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": index}})
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras

MODEL = os.environ.get("MODEL", "conv"); STEPS = int(os.environ.get("STEPS", "5"))
OPT = os.environ.get("OPT", "sgd"); MP = os.environ.get("MP") == "1"; LSO = os.environ.get("LSO") == "1"
SAVE = os.environ.get("SAVE"); LOAD = os.environ.get("LOAD"); GB = int(os.environ.get("GB", "16"))
START = int(os.environ.get("START", "0"))  # first global batch index (for resume)

def log(*a):
    print(f"[{mode}{index}]", *a, flush=True)

strategy = tf.distribute.MultiWorkerMirroredStrategy() if mode == "multi" else tf.distribute.get_strategy()
nw = strategy.num_replicas_in_sync
log("tf", tf.__version__, "keras", keras.__version__, "replicas", nw, "strategy", type(strategy).__name__)
if MP:
    keras.mixed_precision.set_global_policy("mixed_float16")
    log("policy", keras.config.dtype_policy().name)

# ---- data: global batch b = rows perm[b*GB:(b+1)*GB]; worker i takes its contiguous half of each global batch
if MODEL == "resnet":
    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 32, 32, 3)).astype("float32"); Y = rng.integers(0, 10, 256).astype("int64")
else:
    from sklearn.datasets import load_digits
    d = load_digits()
    X = np.kron(d.images, np.ones((2, 2)))[..., None].astype("float32") / 16.0  # 8x8 -> 16x16x1
    Y = d.target.astype("int64")
perm = np.random.default_rng(0).permutation(len(X))
need = (START + STEPS) * GB
idx = np.resize(perm, need)[START * GB:]
Xg, Yg = X[idx], Y[idx]          # STEPS global batches in order

def dataset_fn(ctx):
    i = ctx.input_pipeline_id
    per = ctx.get_per_replica_batch_size(GB)
    if os.environ.get("HALF"):  # negative control: one process, only worker 0's half, loss still / GB (= no all-reduce)
        per = GB // 2; i = 0
    xs = Xg.reshape(STEPS, GB, *Xg.shape[1:])[:, i * per:(i + 1) * per].reshape(-1, *Xg.shape[1:])
    ys = Yg.reshape(STEPS, GB)[:, i * per:(i + 1) * per].reshape(-1)
    return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(per)

def build():
    keras.utils.set_random_seed(1)
    if MODEL == "resnet":
        m = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10,
                                        classifier_activation=None)
        if os.environ.get("SYNCBN"):  # flip the BN layers to synchronized after construction
            n = 0
            for l in m.layers:
                if isinstance(l, keras.layers.BatchNormalization):
                    l.synchronized = True; n += 1
            log("set synchronized=True on", n, "BN layers")
        return m
    layers = [keras.Input((16, 16, 1)), keras.layers.Conv2D(8, 3, activation="relu")]
    if MODEL in ("bn", "syncbn"):
        layers.append(keras.layers.BatchNormalization(synchronized=(MODEL == "syncbn")))
    layers += [keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(10),
               keras.layers.Activation("linear", dtype="float32")]
    return keras.Sequential(layers)

class ShowingLSO(keras.optimizers.LossScaleOptimizer):
    """SHOW_FINITE=1 without AGREE: print each worker's local overflow check."""
    def check_finite(self, grads):
        finite = super().check_finite(grads)
        tf.print("[finite] local", finite, "scale", self.dynamic_scale)
        return finite


def make_opt():
    o = keras.optimizers.SGD(0.1) if OPT == "sgd" else keras.optimizers.Adam(1e-2)
    if (MP or LSO) and not os.environ.get("NOLSO"):
        if os.environ.get("AGREE"):  # the library's scaler (dist_dl.train.engines.keras3)
            from dist_dl.train.engines.keras3 import agreeing_loss_scale_optimizer
        cls = agreeing_loss_scale_optimizer() if os.environ.get("AGREE") else (
            ShowingLSO if os.environ.get("SHOW_FINITE") else keras.optimizers.LossScaleOptimizer)
        o = cls(o, initial_scale=float(os.environ.get("LS_INIT", 2**15)))
    return o

with strategy.scope():
    if LOAD:
        t = time.time()
        model = keras.saving.load_model(LOAD)
        opt = model.optimizer
        log("loaded", LOAD, "in %.2fs" % (time.time() - t), "opt", type(opt).__name__,
            "iterations", int(opt.iterations.numpy()), "n opt vars", len(opt.variables))
    else:
        model = build()
        opt = make_opt()
        model.compile(optimizer=opt)   # only to attach the optimizer so model.save stores its state
        if os.environ.get("TFCKPT_LOAD"):
            opt.build(model.trainable_variables)
            st = tf.train.Checkpoint(model=model, optimizer=opt).read(os.environ["TFCKPT_LOAD"])
            st.assert_consumed()
            log("restored tf.train.Checkpoint, assert_consumed ok, iterations", int(opt.iterations.numpy()))
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    acc = keras.metrics.SparseCategoricalAccuracy() if os.environ.get("METRIC") else None

log("first var type", type(model.trainable_variables[0]).__name__,
    type(model.trainable_variables[0].value).__name__)
dist_ds = strategy.distribute_datasets_from_function(dataset_fn)

def step_fn(x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        per_ex = loss_obj(y, logits)
        loss = tf.nn.compute_average_loss(per_ex, global_batch_size=GB)
        if model.losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        scaled = opt.scale_loss(loss) if ((MP or LSO) and not os.environ.get("NOLSO")) else loss
    grads = tape.gradient(scaled, model.trainable_variables)
    if acc is not None:
        acc.update_state(y, logits)
    opt.apply(grads, model.trainable_variables)
    return loss

@tf.function
def train_step(x, y):
    per_replica = strategy.run(step_fn, args=(x, y))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

def weights():
    return np.concatenate([np.asarray(w, dtype="float64").ravel() for w in model.get_weights()])

w0 = weights(); np.save(f"{out}.init{index}.npy", w0); log("init checksum %.10f" % w0.sum())
losses = []; t0 = time.time(); t_first = None
try:
    for s, (x, y) in enumerate(dist_ds):
        losses.append(float(train_step(x, y)))
        if s == 0:
            t_first = time.time() - t0
    dt = time.time() - t0
    w = weights()
    log("OK steps", len(losses), "loss first/last %.4f -> %.4f" % (losses[0], losses[-1]),
        "mean first3 %.4f last3 %.4f" % (np.mean(losses[:3]), np.mean(losses[-3:])),
        "first step %.2fs, total %.2fs" % (t_first, dt))
    log("final checksum %.10f  abs-sum %.10f  opt iterations %d" % (w.sum(), np.abs(w).sum(), int(opt.iterations.numpy())))
    if MP:
        log("var dtype", model.trainable_variables[0].dtype, "loss scale", float(opt.dynamic_scale.numpy()) if hasattr(opt, "dynamic_scale") else "?")
    if MODEL in ("bn", "syncbn"):
        bn = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)][0]
        log("bn moving_mean[:3]", np.asarray(bn.moving_mean)[:3], "moving_var[:3]", np.asarray(bn.moving_variance)[:3])
    if acc is not None:
        v = acc.variables
        log("metric accuracy", float(acc.result()), "vars", [(x.path, float(x.value.read_value().numpy())) for x in v],
            "tf var", type(v[0].value).__name__, v[0].value.aggregation, v[0].value.synchronization)
    np.save(f"{out}.w{index}.npy", w)
    if SAVE and os.environ.get("SAVE_ONLY0") and mode == "multi" and index != 0:
        log("not saving (SAVE_ONLY0)")
    elif SAVE:
        path = SAVE if (mode == "single" or index == 0) else os.path.join(tempfile.mkdtemp(), "tmp.keras")
        t = time.time()
        model.save(path)
        log("saved", path, "%.2fs" % (time.time() - t), os.path.getsize(path), "bytes")
    TFCK = os.environ.get("TFCKPT_SAVE")
    if TFCK:
        ck = tf.train.Checkpoint(model=model, optimizer=opt)
        p = TFCK if (mode == "single" or index == 0) else os.path.join(tempfile.mkdtemp(), "ck")
        t = time.time(); r = ck.write(p); log("tf.train.Checkpoint written", r, "%.2fs" % (time.time() - t))
    # a collective after saving: do workers still agree / not hang?
    tot = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
    log("post-save collective ok, replicas summed", float(tot))
except Exception as exc:
    import traceback
    traceback.print_exc()
    log("FAIL", type(exc).__name__, str(exc)[:1500])
