"""The application around the stages: configuration files (``config``), the
pipeline's steps as functions (``pipeline``) and as ``dist-dl`` commands
(``steps``, ``cli``), the benchmark driver (``bench``) and the Databricks
integration (``databricks``: notebook widgets, secrets, jobs).

It may import every stage; no stage imports it (``tests/test_design.py``).
"""
