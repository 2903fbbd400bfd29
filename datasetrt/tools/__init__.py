"""Command-line tools behind `datasetrt` subcommands (layer 7, beside cli.py): `inspect`, `pss`."""
