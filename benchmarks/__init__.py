"""Side-by-side benchmarks of datasetrt against its peers (run as `python -m benchmarks.<name>`)."""
