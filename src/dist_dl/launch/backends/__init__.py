"""Where an engine's workers run: ``processes`` (child processes of the
driver) and ``spark_classic`` (the tasks of one Spark barrier stage, through
the SparkContext). Each backend runs any engine of ``dist_dl.launch.engines``
(an `Engine`); builds on ``core`` and
``fork``."""
