"""Everything of the launcher that touches Horovod: ``HorovodRunner``, its
backends (``local``: processes on the driver over Gloo; ``spark``:
``horovod.spark.run``; ``sparkdl``: Databricks' own HorovodRunner), the
patches of Horovod's internals (``spark``, ``sparkfork``, ``termination``),
the Spark workers' entry module and the sparkdl-style Keras callbacks.
Nothing outside this package imports Horovod."""
