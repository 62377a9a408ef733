"""Repository tools: what this checkout's Makefile and tests run, not part of
the wheel (``bundle``: databricks.yml from jobs/*.json, ``make bundle``)."""
