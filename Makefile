# Two commands do all the set-up on a fresh machine (the profile's Python, Java 17, gcc):
#   make demo   install the pinned stack into .venv, run the main job locally
#   make test   install the same way, run the whole test suite (every tier below)
# The tiers, each on its own:
#   make test-unit         tests/unit: no Spark, no training, no worker process; in a
#                          light environment of its own (.venv-unit: no TensorFlow, no
#                          PySpark, no Horovod build), so it runs within a minute or two
#                          of a fresh clone, before the heavy install
#   make test-integration  tests/integration: real Spark, workers and training
#   make test-reliability  tests/reliability: faults injected into real jobs
#   make test-hosts        tests/hosts: the cluster of separate hosts (root)
#   make test-fast         every tier less the tests marked slow
#   make test-connect      the Spark Connect tests alone (dbr-17.3-ml, dbr-18-ml with
#                          its Connect client overlay, dbr-19-ml)
#   make test-repeat N=5   the reliability and separate-hosts tiers N times, then each
#                          scenario's failures out of N (runs/tests/repeat/)
#   make reliability-report  the newest scenario records (runs/tests/reliability/, written
#                          by every run) into the tracked docs/reliability.json
#   make wheel  build dist/dist_dl-<version>-py3-none-any.whl (what `dist-dl jobs deploy --wheel` uploads)
#   make bundle databricks.yml from jobs/*.json (the jobs' one source)
#   make docs   build the documentation site into site/ (strict: a broken link or reference fails)
# A second run reuses .venv (the stamp below) and starts in seconds.
# Profiles (docs/guides/profiles.md): each is one Databricks ML runtime's Python
# stack, pinned in constraints/<profile>.txt at the runtime's versions
# (constraints/runtimes.json; tests/unit/test_profiles.py checks them), CPU
# builds of TensorFlow, PyPI's builds of torch. The default, dbr-15.4-ml
# (Databricks Runtime 15.4 LTS ML), is the last runtime with Horovod, so every
# test of the suite runs on it, in .venv; PROFILE=<profile> installs another
# into .venv-<profile>: dbr-16.4-ml, dbr-17.3-ml and dbr-18-ml (no Horovod, no
# Petastorm: tf.distribute, PyTorch and the pyarrow reader), dbr-19-ml (no
# TensorFlow or Keras either: PyTorch only). A profile's Python is the one its
# file names (`# python: X.Y`): python<X.Y> on PATH, else pyenv's, else set
# PYTHON=.

PROFILE ?=
DEFAULT_PROFILE := dbr-15.4-ml
# The profiles are the files constraints/*.txt.
PROFILES := $(sort $(basename $(notdir $(wildcard constraints/*.txt))))
# The profile meant (unset: the default), whose pins are constraints/<profile>.txt.
PROFILE_NAME := $(or $(PROFILE),$(DEFAULT_PROFILE))
ifeq ($(filter $(PROFILE_NAME),$(PROFILES)),)
$(error PROFILE=$(PROFILE) is not a profile: leave it unset ($(DEFAULT_PROFILE)) or use one of: $(PROFILES))
endif
CONSTRAINTS  := constraints/$(PROFILE_NAME).txt
# The profile's Python: its file's `# python: X.Y` line. PYTHON= on the command
# line or in the environment overrides where to find it, not which version.
PYTHON_VERSION := $(shell sed -n 's/^\# python: *\([0-9][0-9.]*\).*/\1/p' $(CONSTRAINTS))
PYENV_PYTHONS  := $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/$(PYTHON_VERSION).*/bin/python$(PYTHON_VERSION))
ifeq ($(origin PYTHON),undefined)
PYTHON := $(firstword $(foreach p,python$(PYTHON_VERSION) $(PYENV_PYTHONS),$(if $(shell $(p) -c '' 2>/dev/null && echo y),$(p))))
endif
# Fails, saying what to do, where the profile's Python is missing or another.
PYTHON_CHECK = @test -n "$(PYTHON)" || { echo "$(PROFILE_NAME) runs Python $(PYTHON_VERSION) (its runtime's;" \
                 "$(CONSTRAINTS)): no python$(PYTHON_VERSION) on PATH or in pyenv's versions; install one" \
                 "or set PYTHON=/path/to/python$(PYTHON_VERSION)" >&2; exit 1; }; \
               $(PYTHON) -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(None if v == "$(PYTHON_VERSION)" else \
                 "PYTHON=$(PYTHON) is Python " + v + ": $(PROFILE_NAME) runs $(PYTHON_VERSION) ($(CONSTRAINTS))")'
# What the install checks last: Horovod built with Gloo where a profile has it;
# where it has neither Horovod nor Petastorm, that the library picks its engine
# and the pyarrow reader by itself (engine and reader "auto"): tf.distribute
# where TensorFlow is installed, PyTorch where it is not (and then, that
# nothing installed TensorFlow).
GLOO_CHECK := import horovod.tensorflow as h; assert h.gloo_built(), 'Horovod was built without Gloo'
AUTO_CHECK  = from dist_dl.launch import auto_engine; from dist_dl.read.dataset import choose_reader; \
              found = (auto_engine(), choose_reader('auto')); \
              assert found == ('$(1)', 'arrow'), f'engine and reader auto: {found}'
NO_TF_CHECK := import importlib.util; \
               assert importlib.util.find_spec('tensorflow') is None, 'TensorFlow was installed'
DEMO_CONFIG := demo
ifeq ($(PROFILE_NAME),$(DEFAULT_PROFILE))
VENV        := .venv
# The runtime's pyarrow 14 rules out horovod[spark] (pyarrow<11); horovod.spark.run,
# the Spark backend off Databricks, needs only PySpark, which the `local` extra brings.
HOROVOD     := horovod
EXTRAS      := local,petastorm,delta,samples,dev
BUILD_FIRST := tensorflow-cpu keras pyspark petastorm
# tf-keras declares `tensorflow`, which would install a second, full TensorFlow.
NO_DEPS     := tf-keras
CHECK       := $(GLOO_CHECK)
else ifeq ($(PROFILE_NAME),dbr-19-ml)
VENV        := .venv-$(PROFILE_NAME)
# Runtime 19 ML has no TensorFlow and no Keras: PyTorch (the `torch` extra) is
# the engine, and nothing here may bring TensorFlow in.
HOROVOD     :=
EXTRAS      := delta,samples,torch,connect,dev
BUILD_FIRST := pyspark torch torchvision
NO_DEPS     :=
CHECK       := $(call AUTO_CHECK,torch); $(NO_TF_CHECK)
DEMO_CONFIG := demo-torch
else
VENV        := .venv-$(PROFILE_NAME)
# Runtimes 16.4, 17.3 and 18 have neither Horovod nor Petastorm: nothing is built
# from source, and the library picks tf.distribute and the pyarrow reader by itself.
# They ship PyTorch: the `torch` extra (TorchDistributor, torchvision), at the
# runtime's version (PyPI's build: CUDA on x86_64, which runs on CPUs).
HOROVOD     :=
# Mosaic Streaming (the `mds` extra: tests/integration/test_mds.py), at the
# runtime's version; on 17.3, pyspark's Spark Connect client (the `connect` extra:
# tests/integration/test_connect.py). Not on 16.4, whose pyspark 3.5 wheel holds
# no Connect server to test it against. On 18, pyspark 4.1's client does not
# load with the runtime's protobuf 5: its packages go to a client overlay
# (CONNECT_CLIENT, below) that only the Connect tests' client process puts on
# its path, while the server and its workers run the runtime's environment
# (constraints/connect-client/dbr-18-ml.txt).
EXTRAS      := delta,samples,torch,mds,dev
ifeq ($(PROFILE_NAME),dbr-17.3-ml)
EXTRAS      := $(EXTRAS),connect
endif
BUILD_FIRST := tensorflow-cpu keras pyspark torch torchvision
# tf-keras declares `tensorflow`, which would install a second, full TensorFlow.
NO_DEPS     := tf-keras
CHECK       := $(call AUTO_CHECK,tensorflow)
endif
PY     := $(VENV)/bin/python
# A profile whose runtime's packages do not load pyspark's Connect client
# (dbr-18-ml) has a file constraints/connect-client/<profile>.txt, and installs
# the client's own packages at its pins into CONNECT_CLIENT, a folder of its
# environment (pip install --target): the environment of a Connect client,
# which is another machine's than the cluster's. The Connect tests'
# client process runs with that folder first on PYTHONPATH (CONNECT_PYTEST);
# the server they start (tests/support/connect_server.py) and its workers run
# without it. The tests' pass without it leaves the Connect modules skipped
# (tests/support/connect_server.py); a second pass (--connect-only: only the
# Connect modules of the arguments, tests/conftest.py) runs them with it.
CONNECT_CONSTRAINTS := $(wildcard constraints/connect-client/$(PROFILE_NAME).txt)
CONNECT_CLIENT := $(if $(CONNECT_CONSTRAINTS),$(VENV)/connect-client)
CONNECT_CHECK := import google.protobuf as p, pyspark.sql.connect.proto; \
                 assert p.__file__.startswith('$(CURDIR)/$(CONNECT_CLIENT)/'), p.__file__
CONNECT_PYTEST = PYTHONPATH="$(CURDIR)/$(CONNECT_CLIENT)$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m pytest
# $(call with_connect,ARGS): pytest on ARGS; then, where the profile has a client
# overlay, their Connect modules with it. Its exit status is pytest's over both
# passes: a pass that collected no test (5: ARGS hold no Connect module, or
# nothing but them) counts only where the other did not either.
with_connect = $(PY) -m pytest $(XDIST) $(1)$(if $(CONNECT_CLIENT),; a=$$?; \
                 $(CONNECT_PYTEST) $(XDIST) --connect-only $(1); b=$$?; \
                 case $$a:$$b in (5:*) exit $$b;; (*:5) exit $$a;; (*) exit $$(( a ? a : b ));; esac)
PIP    := $(PY) -m pip
# pip does not compile what it installs to bytecode (--no-compile): of the tens of
# thousands of modules in an environment with TensorFlow, torch and PySpark, a
# run imports a part, and Python compiles each on its first import and keeps
# it (below). Environments may be installed at once (.ci/run installs every
# profile's side by side): an editable install of dist_dl writes nothing into
# the checkout (setuptools builds its metadata in a temporary folder), so they
# need no turns.
INSTALL := install --quiet --no-compile
# What the install compiles, importing them in one process (tools/warm_bytecode.py):
# the libraries the tests' processes load, where the profile has them (torch
# first: dist_dl.launch.fork.client._FRAMEWORKS).
WARM_MODULES := torch torch.distributed torchvision tensorflow keras tf_keras horovod.tensorflow \
                petastorm pyspark.sql pyspark.ml pyspark.sql.connect.session mlflow mlflow.pyfunc \
                mlflow.store.tracking.sqlalchemy_store optuna streaming pandas pyarrow.parquet \
                dist_dl.launch dist_dl.train dist_dl.read.dataset
# An environment's stamp names the profile it holds. One that holds another
# profile's stamp (a checkout whose default profile changed) is made anew:
# installing over it would keep a Horovod built against another TensorFlow.
STAMP  := $(VENV)/.installed-$(PROFILE_NAME)
FRESH   = test -e $(1) || ! ls $(dir $(1)).installed* >/dev/null 2>&1 || rm -rf $(dir $(1))
# Horovod is built from source: TensorFlow and Gloo only (no MPI, no GPU here;
# a Databricks GPU runtime ships its own build with NCCL). Its setup.py runs the
# first `cmake` on PATH: the environment's bin comes first, so the pinned cmake
# builds it on any machine (cmake 4 would stop at Gloo's cmake_minimum_required).
HOROVOD_FLAGS := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
                 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
                 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2
PYTEST_ARGS ?=
# What runs here writes each module's bytecode on its first import (into the
# ignored __pycache__ folders), as Python does by default, where the machine's
# environment says not to (PYTHONDONTWRITEBYTECODE): otherwise each of a test
# run's hundreds of Python processes compiles every module it imports, dist_dl's
# and, as pip installs without compiling (INSTALL), the libraries' too.
unexport PYTHONDONTWRITEBYTECODE
# Tests at a time, each in a process of its own (pytest-xdist): one more than
# the machine's cores, at least three (much of the reliability and
# separate-hosts tiers waits on timeouts and on other hosts, so three keep two
# cores busy) and at most one per 4 GB of memory (a test's Spark, workers and
# frameworks). Tests of one cluster share a process (xdist_group,
# tests/conftest.py). JOBS=1 runs them one at a time.
CORES   := $(shell nproc 2>/dev/null || echo 2)
MEM_GB  := $(shell awk '/^MemTotal:/ {print int($$2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 8)
ifeq ($(origin JOBS),undefined)
JOBS := $(shell c=$(CORES); m=$$(( $(MEM_GB) / 4 )); j=$$(( c + 1 > 3 ? c + 1 : 3 )); \
                echo $$(( j < m ? j : (m > 3 ? m : 3) )))
endif
# A test process that dies fails the run at once (--max-worker-restart 0): with
# grouped scheduling, a replaced process can leave the run waiting for ever.
XDIST := $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadgroup --max-worker-restart 0)

.PHONY: install demo test test-unit test-integration test-reliability test-hosts test-fast test-connect \
        test-repeat reliability-report bench wheel bundle docs clean hosts-tools docs-tools profiles

install: $(STAMP)

$(STAMP): $(CONSTRAINTS) $(CONNECT_CONSTRAINTS) setup.py
	$(call FRESH,$(STAMP))
	$(PYTHON_CHECK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) $(INSTALL) --upgrade pip wheel
	# Horovod's build imports TensorFlow, so TensorFlow (and cmake) come first,
	# with the profile's other large packages (PySpark, torch).
	$(PIP) $(INSTALL) -c $(CONSTRAINTS) $(BUILD_FIRST) $(if $(HOROVOD),cmake) setuptools
	$(if $(NO_DEPS),$(PIP) $(INSTALL) --no-deps -c $(CONSTRAINTS) $(NO_DEPS))
	# The build log says which cmake ran (the line starting "cmake version").
	$(if $(HOROVOD),$(HOROVOD_FLAGS) sh -c 'command -v cmake && cmake --version | head -1')
	# --no-cache-dir: pip's wheel cache is shared by every environment of the machine
	# and knows nothing of the TensorFlow a cached Horovod was built against.
	$(if $(HOROVOD),$(HOROVOD_FLAGS) $(PIP) $(INSTALL) --no-cache-dir --no-build-isolation -c $(CONSTRAINTS) $(HOROVOD))
	$(PIP) $(INSTALL) --no-build-isolation -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -c "$(CHECK)"
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m tools.warm_bytecode $(WARM_MODULES)
	# The Connect client's overlay, made anew: exactly its pins, none of their
	# requirements (the environment below it has the rest); checked to load
	# pyspark's client code with its own protobuf.
	$(if $(CONNECT_CLIENT),rm -rf $(CONNECT_CLIENT) && $(PIP) $(INSTALL) --no-deps \
	  --target $(CONNECT_CLIENT) -r $(CONNECT_CONSTRAINTS))
	$(if $(CONNECT_CLIENT),PYTHONPATH=$(CURDIR)/$(CONNECT_CLIENT) $(PY) -c "$(CONNECT_CHECK)")
	touch $(STAMP)

# The unit tier's environment: the library's own requirements at the profile's
# pins, without TensorFlow, PySpark or Horovod (a unit test that needs one of
# them fails here: it belongs in tests/integration).
UNIT_VENV  := $(VENV)-unit
UNIT_PY    := $(UNIT_VENV)/bin/python
UNIT_STAMP := $(UNIT_VENV)/$(notdir $(STAMP))

$(UNIT_STAMP): $(CONSTRAINTS) setup.py
	$(call FRESH,$(UNIT_STAMP))
	$(PYTHON_CHECK)
	test -x $(UNIT_PY) || $(PYTHON) -m venv $(UNIT_VENV)
	$(UNIT_PY) -m pip $(INSTALL) --upgrade pip wheel
	$(UNIT_PY) -m pip $(INSTALL) -c $(CONSTRAINTS) setuptools
	$(UNIT_PY) -m pip $(INSTALL) --no-build-isolation -c $(CONSTRAINTS) -e '.[delta,samples,dev]'
	touch $(UNIT_STAMP)

demo: $(STAMP)
	$(PY) -m dist_dl.cli pipeline --config $(DEMO_CONFIG)

test: $(STAMP) hosts-tools docs-tools
	$(call with_connect,$(PYTEST_ARGS))

test-unit: $(UNIT_STAMP) docs-tools
	$(UNIT_PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: $(STAMP)
	$(call with_connect,tests/integration $(PYTEST_ARGS))

test-reliability: $(STAMP) hosts-tools
	$(call with_connect,tests/reliability $(PYTEST_ARGS))

test-hosts: $(STAMP) hosts-tools
	$(PY) -m pytest $(XDIST) tests/hosts $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(call with_connect,-m "not slow" $(PYTEST_ARGS))

# The Spark Connect tests alone (tests/conftest.py names their modules), with
# the profile's client overlay where it has one.
test-connect: $(STAMP)
	$(if $(CONNECT_CLIENT),$(CONNECT_PYTEST),$(PY) -m pytest) $(XDIST) --connect-only $(PYTEST_ARGS)

# Each round's JUnit report goes to runs/tests/repeat/; the summary counts each
# test's failures over the rounds (the scenarios' records go where every run's go).
N ?= 5
test-repeat: $(STAMP) hosts-tools
	rm -rf runs/tests/repeat && mkdir -p runs/tests/repeat
	for i in $$(seq $(N)); do \
	  $(PY) -m pytest $(XDIST) tests/reliability tests/hosts --junitxml=runs/tests/repeat/round-$$i.xml \
	    $(PYTEST_ARGS) || true; \
	done
	$(PY) tests/support/flake_rate.py runs/tests/repeat/round-*.xml

reliability-report: $(STAMP)
	$(PY) tests/support/scenarios.py report

# The separate-hosts tests (tests/support/host_cluster.py) make network and mount
# namespaces with iproute2's ip and util-linux's unshare/nsenter: installed
# here when missing and this is root (as CI is); elsewhere the tests skip.
# apt runs one at a time (CI's set-up runs tests of several profiles side by side).
APT_LOCK := flock /tmp/dist_dl-apt.lock
hosts-tools:
	@command -v ip >/dev/null && command -v nsenter >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && $(APT_LOCK) sh -c 'apt-get update -qq && apt-get install -y -qq iproute2 util-linux'; } || true

# The docs' browser check (tests/unit/test_docs.py) opens every page of the site in
# Debian's chromium: installed here when missing.
docs-tools:
	$(APT_LOCK) sh tests/support/install_chromium.sh

bench: $(STAMP)
	$(PY) benchmarks/launcher.py

# The project's wheel alone (--no-deps); --no-build-isolation: this
# environment's setuptools builds it, nothing is downloaded.
wheel: $(STAMP)
	$(PY) -m pip wheel --no-deps --no-build-isolation --quiet -w dist .

# databricks.yml, the Databricks Asset Bundle, from the job files jobs/*.json (the jobs' one
# source); tests/unit/test_jobs_bundle.py fails while the committed file is not what this writes.
bundle: $(STAMP)
	$(PY) -m tools.bundle

# The docs extra is part of dev; a .venv installed before it existed gets it here.
docs: $(STAMP)
	$(PY) -c "import mkdocs, mkdocstrings_handlers.python" 2>/dev/null || \
	  $(PIP) $(INSTALL) --no-build-isolation -c $(CONSTRAINTS) -e '.[docs]'
	$(PY) -m mkdocs build --strict -d site

# The profiles besides the default, one a line (what .ci/run installs and tests).
profiles:
	@printf '%s\n' $(filter-out $(DEFAULT_PROFILE),$(PROFILES))

clean:
	rm -rf $(VENV) $(UNIT_VENV) build dist src/*.egg-info runs
