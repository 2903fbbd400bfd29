"""`python -m datasetrt.cli ...`: the console command."""

import sys

from datasetrt.cli.main import main

sys.exit(main())
