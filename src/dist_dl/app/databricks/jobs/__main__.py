"""``python -m dist_dl.app.databricks.jobs jobs validate | deploy | run``."""
import sys

from dist_dl.app.databricks.jobs.command import main

sys.exit(main())
