"""The fork server: a start-up optimisation on machines without GPUs.
Workers are forked from a process that has imported their frameworks
instead of starting as new interpreters (``client``: the launching side;
``_server``: the server process). Builds on ``core`` only."""
