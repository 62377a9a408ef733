"""Where an engine's workers run: ``processes`` (child processes of the
driver), ``spark_classic`` (the tasks of one Spark barrier stage, through
the SparkContext) and ``spark_connect`` (the same stage through the
DataFrame API, for Spark Connect sessions; ``spark_classic``'s backend
hands such a session to it). Each backend runs any engine of
``dist_dl.launch.engines`` (an `Engine`); builds on ``core`` and
``fork``."""
