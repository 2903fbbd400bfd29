"""`python -m datasetrt ...`: the console command (`datasetrt demo`, `datasetrt inspect`, ...)."""

import sys

from datasetrt.cli.main import main

sys.exit(main())
