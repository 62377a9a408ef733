"""Everything of the launcher that touches Horovod: ``HorovodRunner``, its
backends (``local``: processes on the driver over Gloo; ``spark``:
``horovod.spark.run``; ``sparkdl``: Databricks' own HorovodRunner), the
patches of Horovod's internals (``spark``, ``sparkfork``, ``termination``),
the Spark workers' entry module and the sparkdl-style Keras callbacks.
No other module of ``dist_dl.launch`` imports Horovod (tests/unit/test_design.py
checks it). Outside it, Horovod is only named: the fork server
(``fork.client``) preloads Horovod's framework bindings for Horovod jobs,
and the worker's set-up (``core.worker``, ``core.device``) fixes Horovod's
environment variables before ``hvd.init()`` reads them."""
