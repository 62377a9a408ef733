"""``python -m dist_dl.databricks.jobs jobs validate | deploy | run``."""
import sys

from dist_dl.databricks.jobs.command import main

sys.exit(main())
