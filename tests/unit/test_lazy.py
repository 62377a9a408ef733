"""The cases of tests/integration/test_lazy.py that need no Spark, no training
and no worker process."""
import sys
import types

import pytest

from dist_dl.core.lazy import LazyDefinitionError, lazy_attributes

pytestmark = pytest.mark.timeout(120)  # the last test imports TensorFlow


def _module(name, **factories):
    module = types.ModuleType(name)
    module.__getattr__ = lazy_attributes(vars(module), **factories)
    sys.modules[name] = module
    return module


def test_attribute_error_while_defining_surfaces_as_itself():
    def broken():  # what a Keras 3 API gap raised inside a definition
        raise AttributeError("module 'keras.backend' has no attribute 'constant'")

    _module("dist_dl_lazy_broken", Schedule=broken)
    try:
        with pytest.raises(LazyDefinitionError) as caught:
            from dist_dl_lazy_broken import Schedule  # noqa: F401
    finally:
        del sys.modules["dist_dl_lazy_broken"]
    assert not isinstance(caught.value, ImportError)
    assert "dist_dl_lazy_broken.Schedule" in str(caught.value)
    assert "module 'keras.backend' has no attribute 'constant'" in str(caught.value)
    assert isinstance(caught.value.__cause__, AttributeError)


def test_other_errors_pass_unchanged_and_a_good_definition_is_kept():
    calls = []

    def needs_package():
        raise ImportError("tf-keras is not installed: pip install 'tf-keras==2.16.*'")

    def fine():
        calls.append(1)
        return type("Fine", (), {})

    module = _module("dist_dl_lazy_mixed", Missing=needs_package, Fine=fine)
    try:
        with pytest.raises(ImportError, match="pip install 'tf-keras==2.16"):
            module.Missing
        from dist_dl_lazy_mixed import Fine
        assert module.Fine is Fine and calls == [1]  # built once, then a plain global
        with pytest.raises(AttributeError, match="has no attribute 'Other'"):
            module.Other
    finally:
        del sys.modules["dist_dl_lazy_mixed"]
