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

DOCS = ["mkdocs>=1.6,<2", "mkdocstrings[python]>=1.0,<2", "mkdocstrings-python>=2.0,<3"]

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
        # (dist_dl.launch._fork_server): ps names the worker's command.
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
        "delta": ["deltalake>=1.0"],
        # Petastorm's reader (reader="petastorm"; "auto" uses it where it
        # imports). Not a hard requirement: runtimes 16.4 and 17.3 LTS ML ship
        # no Petastorm, and 0.13.1 does not import with their pyarrow 16+; the
        # arrow reader (dist_dl.read.arrow) needs only pyarrow.
        "petastorm": ["petastorm>=0.12.1"],
        # PyTorch, for TorchDistributor (dist_dl.launch.torch_distributor):
        # torch.distributed with Gloo (CPU) or NCCL (GPU), and torchvision's
        # models (model="resnet50"). Every runtime ML ships both; the profiles
        # pin the runtime's versions. simplejpeg: the torch loader's JPEG
        # decoder on the CPU (dist_dl.read.imaging; Pillow where it is missing).
        "torch": ["torch>=2.0", "torchvision>=0.15", "simplejpeg>=1.6"],
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
