"""A training script for test_stuck_workers.py: iterates a `to_torch_dataloader` with two workers,
prints `{"parent": pid, "workers": [pids]}` as one JSON line once the first batch arrived, then
waits on stdin (the test SIGKILLs it there).

Usage: python torch_parent.py CACHE_DIR START_METHOD MODE
MODE "idle": the workers are left with their prefetched batches; "blocked": each worker blocks
forever (on a lock, a futex) in its sample transform after its first batch, as a worker stuck in
user code would.
"""

from __future__ import annotations

import json
import os
import sys
import threading

BATCH = 4
_transformed = 0


def keep(batch):
    return [(s.sample_id, len(s.data)) for s in batch]


def stall_after_first_batch(sample):
    global _transformed
    _transformed += 1
    if _transformed > BATCH:
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # never released: blocks on a futex for good
    return sample


def main() -> None:
    import datasetrt as drt

    cache, method, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    ds = drt.CachedDataset([cache], reader_config=drt.ReaderConfig(seed=1))
    loader = ds.to_torch_dataloader(
        num_workers=2,
        batch_size=BATCH,
        collate_fn=keep,
        verbose=False,
        multiprocessing_context=method,
        sample_transform_fn=stall_after_first_batch if mode == "blocked" else None,
    )
    it = iter(loader)
    next(it)
    print(json.dumps({"parent": os.getpid(), "workers": [w.pid for w in it._workers]}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
