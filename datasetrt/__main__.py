"""`python -m datasetrt ...`: the console command (`datasetrt demo`, `datasetrt inspect`, ...)."""

import sys

from datasetrt.cli.command import main

sys.exit(main())
