"""The few switches between the TensorFlow lines the library runs on; one
code path everywhere else.

TensorFlow up to 2.15 ships Keras 2 as ``tf.keras``. From 2.16 (Databricks
Runtime 15.4 LTS ML has 2.16.1) ``keras`` is Keras 3, and ``tf.keras`` is
Keras 3 too unless ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is
imported, in which case it is ``tf_keras`` (Keras 2, the ``tf-keras``
package). Horovod 0.28.1's Keras integration works only with Keras 2
(horovod#4290: "'Variable' object has no attribute 'ref'"), so on 2.16:

- every worker gets ``TF_USE_LEGACY_KERAS=1`` in its environment from the
  start (``worker_env``), so ``tf.keras`` in user code and in Horovod is
  Keras 2;
- the library itself builds, trains, saves and loads models with ``keras()``,
  which is ``tf_keras`` there, whatever the calling process set (a notebook
  may have imported TensorFlow long before);
- ``horovod.tensorflow.keras`` takes its backend from the ``keras`` package
  (``from keras import backend as K``), which is Keras 3's and lacks
  ``constant``, ``variable`` and ``get_session``: ``patch_horovod_keras``
  points it at Keras 2's backend, which is what that import gave on the
  TensorFlow lines Horovod was written for.

Keras 3 itself (``train_distributed(..., keras=3)``, the tf.distribute
engine only): a worker started with ``DIST_DL_KERAS=3`` (``NATIVE_KERAS_ENV``)
and without ``TF_USE_LEGACY_KERAS`` gets the ``keras`` package from
``keras()``, so the same library code (model registry, callbacks,
checkpoints, the logged model) builds and saves Keras 3 models there. A
``.keras`` file says which Keras wrote it (``keras_version`` in its
``metadata.json``); ``load_keras_file`` loads it with that one.

Nothing here imports TensorFlow until asked for a Keras module.

TensorFlow 2.16's AutoGraph (``tensorflow/python/autograph/core/config.py``)
leaves the ``keras`` package's functions alone but not ``tf_keras``'s: the
first ``fit``, ``evaluate`` or ``predict`` of a Keras 2 model there converts
some 1,400 of tf-keras's own functions (about 25 CPU seconds per process for
a small CNN, against one where AutoGraph skips them: on TensorFlow 2.15, whose
Keras 2 is the ``keras`` package, and from 2.17, whose rules add
``DoNotConvert('tf_keras')``). ``skip_autograph_of_tf_keras`` adds
that rule where it is missing: ``keras()`` does it when it gives ``tf_keras``,
and workers (``keras_worker_fixes``) do it when their code first imports
``tf_keras``, through ``tf.keras`` or directly.

No TensorFlow's rules name Horovod, whose TensorFlow binding is graph code
(it runs in TensorFlow 1 graphs, where nothing converts it): the first step
of a model compiled with Horovod's ``DistributedOptimizer`` converts about
180 of Horovod's functions (rank, size, the allreduce, compression, process
sets), about 1 CPU second per worker. Workers add that rule too
(``skip_autograph_of_horovod``) when their code first imports
``horovod.tensorflow``. A rule does not reach the functions Horovod hands to
``tf.function`` itself (``horovod.tensorflow.util._make_subgraph``: the
optimizer's gradient allreduce and ``broadcast_variables``'s group), which
AutoGraph converts as a user's own: about 0.6 CPU seconds in a worker's
first step. Their Python branches on settings and lists only, and their one
condition on a tensor is an explicit ``tf.cond``, so the same hook has them
traced with ``autograph=False``.

One more: databricks-sdk 0.20 (Databricks Runtime 15.4's) has no
``as_shallow_dict`` on its settings classes (``shallow_fields``).

And MLflow 3 (Databricks Runtime 17.3 LTS ML has 3.0.1) makes a logged model
an entity of its own: ``log_model`` takes ``name=`` (``artifact_path=`` is
deprecated and warns), and the model's files are stored under the
experiment's ``models/<model id>/artifacts``, no longer in the run's
artifacts. ``runs:/<run id>/<name>`` URIs still resolve to it, and model
versions still carry the run id. ``model_name_argument`` and
``logged_model_location`` give the one call for MLflow 2 and 3. The library
keeps returning ``runs:/`` URIs on MLflow 3 (its FAQ calls them deprecated
for logged models): the model's own ``models:/m-<id>`` does not take a path
below it on 3.0.1 (``models:/m-<id>/artifacts/model.keras`` is read as a
registered model's name), which ``runs:/`` does on both.
"""
from __future__ import annotations

import copyreg
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys

from dist_dl.core.optional import require

__all__ = ["LEGACY_KERAS_ENV", "NATIVE_KERAS_ENV", "keras", "keras3_default", "native_keras3",
           "keras3_training_problem",
           "is_keras3_model", "saved_keras_major", "load_keras_file", "worker_env", "patch_horovod_keras",
           "skip_autograph_of_tf_keras", "keras_worker_fixes",
           "require_tf_keras", "not_a_library_keras_model", "pickle_tensorflow_lazy_modules_by_name",
           "shallow_fields", "mlflow3", "model_name_argument", "logged_model_location"]

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
# Set (to "3") in the environment of a worker that trains Keras 3 models.
NATIVE_KERAS_ENV = "DIST_DL_KERAS"
# The TensorFlow distributions whose version names the tf-keras to install.
_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tensorflow-intel")
# Horovod modules that bind ``K`` from the ``keras`` package at import.
_HOROVOD_KERAS_MODULES = ("horovod.tensorflow.keras", "horovod.tensorflow.keras.callbacks")
# Horovod modules that bind ``_make_subgraph`` from horovod.tensorflow.util at import.
_HOROVOD_SUBGRAPH_MODULES = ("horovod.tensorflow", "horovod.tensorflow.functions")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def keras3_default() -> bool:
    """True where ``tf.keras`` would be Keras 3 (the ``keras`` package is 3.x)."""
    version = _version("keras")
    return version is not None and int(version.split(".")[0]) >= 3


def _tf_keras_installed() -> bool:
    return importlib.util.find_spec("tf_keras") is not None


def require_tf_keras() -> None:
    """Raise ImportError naming the package to install when Keras 3 is the
    default and tf-keras (Keras 2, which Horovod needs) is missing."""
    if keras3_default() and not _tf_keras_installed():
        tf_version = next(filter(None, map(_version, _TF_DISTRIBUTIONS)), None)
        wanted = ".".join(tf_version.split(".")[:2]) + ".*" if tf_version else "<TensorFlow's version>"
        raise ImportError(
            f"this TensorFlow ({tf_version or 'unknown version'}) makes Keras 3 the default, and "
            "Horovod's Keras integration needs Keras 2 (horovod#4290), which is the tf-keras "
            f"package matching TensorFlow: pip install 'tf-keras=={wanted}'")


def worker_env() -> dict[str, str]:
    """Environment every worker starts with: Keras 2 as ``tf.keras`` where
    Keras 3 is the default and tf-keras is installed (without tf-keras,
    ``require_tf_keras`` says what to install when Keras is first needed)."""
    if keras3_default() and _tf_keras_installed():
        return {LEGACY_KERAS_ENV: "1"}
    return {}


def use_worker_env() -> None:
    """In a Spark task that runs user code (an ensemble member's factory, a
    search trial): `worker_env()`'s variables, unless set, so that the
    task's first ``tf.keras`` is Keras 2 as in the library's training workers
    (Keras 3 models do not pickle, and Horovod needs Keras 2), and
    `keras_worker_fixes()`. Best effort: a reused Python worker whose
    ``tf.keras`` was already used keeps it."""
    for name, value in worker_env().items():
        os.environ.setdefault(name, value)
    keras_worker_fixes()


def native_keras3() -> bool:
    """True in a process that works with Keras 3 itself (a ``keras=3``
    worker: ``DIST_DL_KERAS=3`` and Keras 3 installed)."""
    return os.environ.get(NATIVE_KERAS_ENV) == "3" and keras3_default()


def keras():
    """The Keras module the library works with: ``tf.keras`` where it is
    Keras 2, ``tf_keras`` where Keras 3 is the default, and the ``keras``
    package (Keras 3) in a process that asked for it (`native_keras3()`)."""
    if native_keras3():
        return importlib.import_module("keras")
    if keras3_default():
        require_tf_keras()
        module = importlib.import_module("tf_keras")
        skip_autograph_of_tf_keras()
        return module
    # Named with its extra where TensorFlow is missing (Databricks Runtime 19 ML).
    return require("tensorflow", "Keras (the TensorFlow engines, their callbacks and "
                                 "models)").keras


def keras3_training_problem() -> str | None:
    """Why ``train_distributed(..., keras=3)`` cannot train here, or None.

    It needs Keras 3.5 or later: Keras 3.2.1 (Databricks Runtime 15.4 LTS
    ML's) all-reduces gradients inside the optimizer's cross-replica update,
    where there is no replica context, so under MultiWorkerMirroredStrategy
    each worker applies its own gradient (keras-team/keras#19891): two
    workers at half the batch end far from one worker at the full batch,
    where Keras 3.5.0 and 3.11.2 agree to float precision
    (benchmarks/keras3_loop.py)."""
    version = _version("keras")
    if version is None or not keras3_default():
        return (f"keras=3 but the keras package here is {version or 'not installed'}: Keras 3 "
                "comes with TensorFlow 2.16 and later; use keras=2 with this TensorFlow")
    major_minor = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if major_minor < (3, 5):
        return (f"keras=3 needs Keras 3.5 or later, and this is Keras {version} (Databricks "
                "Runtime 15.4 LTS ML has 3.2.1): its optimizer does not sum the workers' "
                "gradients under MultiWorkerMirroredStrategy (keras-team/keras#19891); use "
                "keras=2 (tf-keras, with Horovod or tf.distribute) with this Keras")
    return None


def is_keras3_model(model) -> bool:
    """True for a model (or layer) of the ``keras`` package where that is Keras 3."""
    return keras3_default() and type(model).__module__.split(".")[0] == "keras"


def saved_keras_major(path: str | os.PathLike) -> int:
    """The major version of the Keras that wrote the ``.keras`` file ``path``
    (from its ``metadata.json``; 2 where it says nothing)."""
    import json
    import zipfile

    with zipfile.ZipFile(path) as archive:
        try:
            metadata = json.loads(archive.read("metadata.json"))
        except KeyError:
            return 2
    version = str(metadata.get("keras_version", "2"))
    return int(version.split(".")[0]) if version.split(".")[0].isdigit() else 2


def load_keras_file(path: str | os.PathLike, **kwargs):
    """``load_model`` of the Keras that wrote ``path``: the ``keras`` package
    for a Keras 3 file, else `keras()` (tf-keras where Keras 3 is the
    default)."""
    if saved_keras_major(path) >= 3:
        if not keras3_default():
            raise ValueError(f"{path} was saved by Keras 3, which is not installed here "
                             f"(keras {_version('keras')}): load it where TensorFlow 2.16 or "
                             "later and Keras 3 are")
        module = importlib.import_module("keras")
    else:
        module = keras() if not native_keras3() else importlib.import_module("tf_keras")
    return module.models.load_model(os.fspath(path), **kwargs)


def not_a_library_keras_model(model) -> str:
    """Why ``model`` is not a model of `keras()` (for the error), and what
    to do: where Keras 3 is TensorFlow's default, a model built with
    ``tf.keras`` or ``keras`` in a process without ``TF_USE_LEGACY_KERAS=1``
    is a Keras 3 model, which the library's Keras 2 cannot save or load."""
    kind = f"{type(model).__module__}.{type(model).__name__}"
    if keras3_default() and type(model).__module__.split(".")[0] == "keras":
        return (f"model is a Keras 3 model ({kind}); the library logs Keras 3 models from "
                f"Keras 3.5 on (this is {_version('keras')}), and Keras 2 models (tf-keras, as "
                "Horovod needs, horovod#4290) everywhere: build it with dist_dl.core.compat.keras() "
                "(or `import tf_keras`), or set TF_USE_LEGACY_KERAS=1 before TensorFlow is first "
                "imported so that tf.keras is Keras 2")
    return f"model must be a Keras Model of {keras().__name__}, got {kind}"


def _point_at_keras2_backend(module) -> None:
    if getattr(module, "K", None) is not None and keras3_default():
        module.K = keras().backend


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a fix on a named module right after it is first executed."""

    def __init__(self, names, fix):
        self.names = frozenset(names)
        self.fix = fix

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.fix(module)

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def _after_import(names, fix) -> None:
    """Run ``fix(module)`` on each of ``names`` now if imported, else right
    after its first import (once per ``fix`` and process)."""
    for name in names:
        if name in sys.modules:
            fix(sys.modules[name])
    if not any(isinstance(f, _AfterImport) and f.fix is fix for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(names, fix))


def patch_horovod_keras() -> None:
    """Give ``horovod.tensorflow.keras`` (and its callbacks) Keras 2's backend
    where Keras 3 is the default: now if imported, else when imported.
    A no-op on TensorFlow lines with Keras 2."""
    if keras3_default():
        _after_import(_HOROVOD_KERAS_MODULES, _point_at_keras2_backend)


def _skip_autograph(package: str) -> None:
    """Add AutoGraph's rule that leaves ``package``'s functions alone, where
    TensorFlow's autograph is imported and no rule names it yet."""
    config = sys.modules.get("tensorflow.python.autograph.core.config")
    config_lib = sys.modules.get("tensorflow.python.autograph.core.config_lib")
    if config is None or config_lib is None:
        return
    if not any(rule.matches(package) for rule in config.CONVERSION_RULES
               if isinstance(rule, config_lib.DoNotConvert)):
        config.CONVERSION_RULES = (*config.CONVERSION_RULES, config_lib.DoNotConvert(package))


def skip_autograph_of_tf_keras(module=None) -> None:
    """Have AutoGraph leave tf-keras's own functions alone, as it does the
    ``keras`` package's, where this TensorFlow's rules do not (2.16; see the
    module's docstring). Idempotent; imports nothing that is not imported
    (``module``: the tf_keras module, when called as an import hook)."""
    _skip_autograph("tf_keras")


def skip_autograph_of_horovod(module=None) -> None:
    """Have AutoGraph leave Horovod's own functions alone, the ones Horovod
    makes ``tf.function``s of included (see the module's docstring).
    Idempotent; imports nothing that is not imported (``module``:
    horovod.tensorflow, when called as an import hook)."""
    _skip_autograph("horovod")
    for name in _HOROVOD_SUBGRAPH_MODULES:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "_make_subgraph"):
            module._make_subgraph = _graph_function


def _graph_function(python_function):
    """``horovod.tensorflow.util._make_subgraph`` (``tf.function(f)``),
    without AutoGraph's rewrite."""
    import tensorflow as tf

    return tf.function(python_function, autograph=False)


def keras_worker_fixes() -> None:
    """What a process running Keras code for the library (a training worker,
    an ensemble member's or a search trial's Spark task) needs before that
    code first imports Horovod's Keras integration or tf-keras: Keras 2's
    backend for Horovod, and AutoGraph's rules for tf-keras and Horovod."""
    if keras3_default():
        _after_import(_HOROVOD_KERAS_MODULES, _point_at_keras2_backend)
        _after_import(("tf_keras",), skip_autograph_of_tf_keras)
    _after_import(("horovod.tensorflow",), skip_autograph_of_horovod)


def _lazy_module(parent: str, name: str):
    """The lazily loaded module ``parent.name`` (``tensorflow.keras`` on
    TensorFlow 2.15), as that process's TensorFlow gives it."""
    return getattr(importlib.import_module(parent), name)


def _keras_lazy_loader(parent: str, mode, submodule, name: str):
    """A new ``KerasLazyLoader`` (TensorFlow 2.16+), which picks its Keras
    when first used, by this process's ``TF_USE_LEGACY_KERAS``: Keras 2 in a
    worker, whatever the driver's loader had picked."""
    from tensorflow.python.util.lazy_loader import KerasLazyLoader

    return KerasLazyLoader(vars(importlib.import_module(parent)), mode=mode, submodule=submodule,
                           name=name)


def _reduce_lazy_module(module):
    attrs = vars(module)  # the loader's own fields; reading them loads nothing
    if "_tfll_name" in attrs:  # TensorFlow 2.16+'s KerasLazyLoader
        parent = attrs["_tfll_parent_module_globals"]["__name__"]
        return _keras_lazy_loader, (parent, attrs["_tfll_mode"], attrs["_tfll_submodule"],
                                    attrs["_tfll_name"])
    parent = (attrs.get("_parent_module_globals") or {}).get("__name__")
    name = attrs.get("_local_name")
    if parent and name:
        return _lazy_module, (parent, name)
    return importlib.import_module, (module.__name__,)


def pickle_tensorflow_lazy_modules_by_name() -> None:
    """Let pickle (and cloudpickle, which consults copyreg) ship TensorFlow's
    lazily loaded modules (``from tensorflow import keras`` gives a
    ``KerasLazyLoader``) by name, re-imported where they are unpickled, as
    modules are. Without it they cannot be pickled at all. Only needed, and
    only done, once TensorFlow is imported."""
    loaders = sys.modules.get("tensorflow.python.util.lazy_loader")
    if loaders is None:
        return
    for cls in (getattr(loaders, "LazyLoader", None), getattr(loaders, "KerasLazyLoader", None)):
        if cls is not None and copyreg.dispatch_table.get(cls) is not _reduce_lazy_module:
            copyreg.pickle(cls, _reduce_lazy_module)


def shallow_fields(settings) -> dict:
    """The set top-level fields of a databricks-sdk settings dataclass, as
    keyword arguments for the matching API call (what newer SDKs'
    ``as_shallow_dict()`` gives; 0.20 lacks it). Like it, empty lists and
    maps count as unset (0.20's ``from_dict`` fills them in)."""
    values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    return {name: value for name, value in values.items()
            if value is not None and value != [] and value != {}}


def mlflow3() -> bool:
    """True where MLflow is 3.x or later (logged models of their own)."""
    version = _version("mlflow") or _version("mlflow-skinny")
    return version is not None and int(version.split(".")[0]) >= 3


def model_name_argument(name: str) -> dict[str, str]:
    """The keyword naming a model for ``mlflow.<flavor>.log_model``:
    ``name=`` on MLflow 3 (where ``artifact_path=`` is deprecated),
    ``artifact_path=`` before it (where ``name=`` does not exist)."""
    return {"name": name} if mlflow3() else {"artifact_path": name}


def logged_model_location(info, name: str) -> str:
    """Where the files of the model just logged (``info``, what ``log_model``
    returned, inside the active run, under ``name``) are, as an artifact URI
    that needs no tracking server: the run's ``artifacts/<name>`` before
    MLflow 3, the logged model's own artifact location from MLflow 3 on
    (its run's artifacts hold no copy there)."""
    import mlflow

    if mlflow3():
        return mlflow.get_logged_model(info.model_id).artifact_location
    return mlflow.get_artifact_uri(name)
