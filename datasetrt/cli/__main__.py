"""`python -m datasetrt.cli ...`: the console command."""

import sys

from datasetrt.cli.command import main

sys.exit(main())
