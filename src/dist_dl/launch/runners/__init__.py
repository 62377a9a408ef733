"""The runners users call, siblings over ``base.Runner``:
``TFDistributeRunner``, ``MirroredStrategyRunner`` and ``TorchDistributor``
here, ``HorovodRunner`` in ``dist_dl.launch.horovod``."""
