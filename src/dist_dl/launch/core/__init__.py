"""What every engine and backend shares: the launcher interface (``backend``),
the job's errors, the workers' output protocol, the worker's own code
(``worker``, ``_worker_main``), devices and threads, the network helpers, the
rendezvous of engines whose workers meet at addresses they pick, the channel
of a Spark task's output to the driver, the slot and GPU checks made before
Spark tasks start, the end of a process tree, and the weights check. Imports
nothing else of ``dist_dl.launch``."""
