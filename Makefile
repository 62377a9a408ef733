# Two commands do all the set-up on a fresh machine (Python 3.10+, Java 17, gcc):
#   make demo   install the pinned stack into .venv, run the main job locally
#   make test   install the same way, run the whole test suite
#   make wheel  build dist/dist_dl-<version>-py3-none-any.whl (what `dist-dl jobs deploy --wheel` uploads)
#   make test-fast   the same without the tests marked slow (over a minute each)
# A second run reuses .venv (the stamp below) and starts in seconds.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# Horovod is built from source: TensorFlow and Gloo only (no MPI, no GPU here;
# a Databricks GPU runtime ships its own build with NCCL).
HOROVOD_FLAGS := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
                 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2
PYTEST_ARGS ?=

.PHONY: install demo test test-fast bench wheel clean hosts-tools

install: $(STAMP)

$(STAMP): constraints.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip wheel
	# Horovod's build imports TensorFlow, so TensorFlow (and cmake) come first.
	$(PIP) install --quiet -c constraints.txt tensorflow-cpu cmake setuptools
	$(HOROVOD_FLAGS) $(PIP) install --quiet --no-build-isolation -c constraints.txt 'horovod[spark]'
	$(PIP) install --quiet --no-build-isolation -c constraints.txt -e '.[local,delta,samples,dev]'
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -c "import horovod.tensorflow as h; assert h.gloo_built(), 'Horovod was built without Gloo'"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m dist_dl.cli pipeline --config demo

test: $(STAMP) hosts-tools
	$(PY) -m pytest $(PYTEST_ARGS)

# The separate-hosts tests (tests/hosts.py) make network and mount
# namespaces with iproute2's ip and util-linux's unshare/nsenter: installed
# here when missing and this is root (as CI is); elsewhere the tests skip.
hosts-tools:
	@command -v ip >/dev/null && command -v nsenter >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq iproute2 util-linux; } || true

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/launcher.py

# The project's wheel alone (--no-deps); --no-build-isolation: this
# environment's setuptools builds it, nothing is downloaded.
wheel: $(STAMP)
	$(PY) -m pip wheel --no-deps --no-build-isolation --quiet -w dist .

clean:
	rm -rf $(VENV) build dist src/*.egg-info runs
