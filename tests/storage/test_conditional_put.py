"""Create-only puts from racing processes: exactly one writer publishes, the others learn it lost."""

from __future__ import annotations

import multiprocessing

from tests.storage._workers import race_put_if_absent
from tests.storage.conftest import DEADLINE_S, make_store

WRITERS = 3
ROUNDS = 4


def test_of_racing_writers_exactly_one_wins(s3_proxy, bucket, no_leaks):
    ctx = multiprocessing.get_context("spawn")
    store = make_store(s3_proxy, bucket)
    results = ctx.Queue()
    barrier = ctx.Barrier(WRITERS)
    names = [f"round{n}/manifest.json" for n in range(ROUNDS)]
    procs = [
        ctx.Process(target=race_put_if_absent, args=(store, names, f"writer {i}".encode() * 100, barrier, results))
        for i in range(WRITERS)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=DEADLINE_S) for _ in range(WRITERS * ROUNDS)]
    for proc in procs:
        proc.join(DEADLINE_S)
        assert proc.exitcode == 0
    results.close()
    results.join_thread()
    for name in names:
        mine = [(kind, data) for n, kind, data in outcomes if n == name]
        assert sorted(kind for kind, _ in mine) == ["lost"] * (WRITERS - 1) + ["won"], mine
        [winner] = [data for kind, data in mine if kind == "won"]
        assert store.get(name, max_bytes=10_000) == winner  # the object is the winner's, whole
        puts = s3_proxy.matching("PUT", f"caches/a/{name}")
        assert len(puts) == WRITERS and all(r.if_none_match == "*" for r in puts)
