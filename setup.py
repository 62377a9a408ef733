"""dist_dl: distributed deep learning on Spark (Horovod, Petastorm, MLflow).

Ranges here are what the library needs; the exact versions known to work
together are pinned in constraints/dbr-*.txt (Databricks Runtimes 15.4, the
default profile, 16.4 and 17.3 LTS ML; their tf-keras is installed by the
Makefile: its metadata requires the full `tensorflow`, not tensorflow-cpu).
numpy 2 and MLflow 3 are in range: runtime 17.3 LTS ML has numpy 2.1 and
MLflow 3.0 (profile dbr-17.3-ml), 15.4 has numpy 1.23 and MLflow 2.13, and the
library runs on both
(MLflow's differences in dist_dl.core.compat). TensorFlow, Horovod and PySpark are not
hard requirements: a Databricks ML runtime ships its own (GPU) builds, and a
pip-installed tensorflow-cpu would shadow them. Locally, `make` installs them.
"""
from setuptools import find_packages, setup

# The site: MkDocs, mkdocstrings, code highlighted at build time (pymdown-extensions
# with Pygments); its pages are checked in Chromium over websocket-client.
DOCS = ["mkdocs>=1.6,<2", "mkdocstrings[python]>=1.0,<2", "mkdocstrings-python>=2.0,<3",
        "pymdown-extensions>=10.0", "Pygments>=2.16", "websocket-client>=1.6"]

setup(
    name="dist_dl",
    version="0.1.0",
    description="Train deep-learning models across a Spark cluster",
    # conf/ ships inside the wheel as dist_dl.conf, so that jobs and the
    # command line find the configurations by name on any cluster.
    package_dir={"": "src", "dist_dl.conf": "conf"},
    packages=find_packages("src") + ["dist_dl.conf"],
    package_data={"dist_dl.conf": ["*.yaml"]},
    python_requires=">=3.10",
    install_requires=[
        "cloudpickle>=2.0",
        "numpy>=1.23,<3",
        "pandas>=1.5,<3",
        "pyarrow>=10",
        "mlflow>=2.9,<4",
        "optuna>=3.4",
        "databricks-sdk>=0.20",
        "psutil>=5.9",
        # The process title of a worker forked by the fork server
        # (dist_dl.launch.fork._server): ps names the worker's command.
        "setproctitle>=1.3",
        "pillow>=9",
        "pyyaml>=6",
    ],
    extras_require={
        # What a machine without a Databricks runtime needs; horovod must be
        # built with Gloo (see the Makefile for the flags). Not horovod[spark]:
        # its pyarrow<11 rules out every runtime's pyarrow (14 and later), and
        # horovod.spark.run needs only PySpark.
        "local": ["tensorflow-cpu>=2.15,<2.17", "pyspark>=3.4,<3.6", "horovod==0.28.1"],
        # TensorFlow, for the engines "horovod" and "tensorflow", their runners
        # (TFDistributeRunner, MirroredStrategyRunner) and Keras models. Not a
        # hard requirement: Databricks Runtime 19 ML ships none (the library
        # trains with PyTorch there), and the runtimes before it their own GPU
        # build, which a pip-installed TensorFlow would shadow. Keras 2 where
        # Keras 3 is the default: tf-keras of TensorFlow's version
        # (dist_dl.core.compat.require_tf_keras names it).
        "tensorflow": ["tensorflow>=2.15"],
        "delta": ["deltalake>=1.0"],
        # Petastorm's reader (reader="petastorm"; "auto" uses it where it
        # imports). Not a hard requirement: runtimes 16.4 and 17.3 LTS ML ship
        # no Petastorm, and 0.13.1 does not import with their pyarrow 16+; the
        # arrow reader (dist_dl.read.arrow) needs only pyarrow.
        "petastorm": ["petastorm>=0.12.1"],
        # PyTorch, for TorchDistributor (dist_dl.launch.runners.torch_distributor):
        # torch.distributed with Gloo (CPU) or NCCL (GPU), and torchvision's
        # models (model="resnet50"). Every runtime ML ships both; the profiles
        # pin the runtime's versions. simplejpeg: the torch loader's JPEG
        # decoder on the CPU (dist_dl.read.imaging; Pillow where it is
        # missing). nvimgcodec: its decoder of a crop's window (CPU backend,
        # no CUDA needed; wheels for Linux only, simplejpeg elsewhere).
        "torch": ["torch>=2.0", "torchvision>=0.15", "simplejpeg>=1.6",
                  "nvidia-nvimgcodec-cu12>=0.9; platform_system == 'Linux'"],
        # Mosaic Streaming: dataframe_to_mds writes the MDS datasets the torch
        # engine reads (dist_dl.read.mds reads them without it, but a
        # compressed shard needs its decompressor, which streaming brings).
        "mds": ["mosaicml-streaming>=0.11"],
        # pyspark's Spark Connect client (pyspark[connect]'s own requirements
        # beyond pandas, pyarrow and numpy): for SparkSession.builder.remote(...)
        # off Databricks; Databricks Connect brings its own.
        # (pyspark 3.5's lower bounds; pyspark 4.0 asks for 1.67 / 1.65).
        # zstandard: pyspark 4.1's client does not start without it.
        "connect": ["grpcio>=1.56", "grpcio-status>=1.56", "googleapis-common-protos>=1.56.4",
                    "zstandard>=0.25"],
        # scikit-learn's bundled datasets: the sklearn_* sources of the demo
        # pipeline, ensemble and prepare-data (dist_dl.core.optional names it).
        "samples": ["scikit-learn>=1.3"],
        # The documentation site (make docs): MkDocs, and mkdocstrings, which
        # reads the docstrings statically (griffe) without importing TensorFlow
        # or Spark.
        "docs": DOCS,
        # The tests build the site in strict mode (tests/unit/test_docs.py).
        "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "scikit-learn>=1.3", *DOCS],
    },
    entry_points={"console_scripts": ["dist-dl=dist_dl.cli:main"]},
)
