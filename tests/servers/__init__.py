"""Test servers: a real S3 API (the server mode of moto) and a fault-injecting proxy, for tests and benchmarks."""
