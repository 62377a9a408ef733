"""A placeholder for torchvision, for the tests that write MDS datasets only.

mosaicml-streaming 0.12 imports ``torchvision.datasets`` and
``torchvision.transforms.functional`` as it is imported (``streaming/vision``),
though its writers (``MDSWriter``, ``dataframe_to_mds``) use neither. The
torchvision wheels on PyPI are CUDA builds, which do not load with the CPU
build of torch the profiles install (their ``_C.so`` needs
``libc10_cuda.so``). With this folder first on ``sys.path`` (and
``PYTHONPATH``, for Spark's Python workers), ``import streaming`` succeeds;
any use of these names fails loudly.
"""


def _unavailable(*args, **kwargs):
    raise RuntimeError("torchvision placeholder (tests/support/torchvision_placeholder): "
                       "the real torchvision is not installed here")


__version__ = "0+placeholder"
