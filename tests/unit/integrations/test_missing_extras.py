"""Without torch, Ray or JAX (hidden in a fresh interpreter by a `sys.meta_path` finder that refuses
them, as an uninstalled package is refused), each feature that needs one raises
`MissingExtraError` (an ImportError) naming the feature asked for and ending with the command that
installs its extra; the core reads as before.

datasetrt/integrations/torch/__init__.py (`require_torch`), datasetrt/integrations/ray.py
(`write_caches`), `SampleBatch.to_torch` and `SampleBatch.to_jax` (datasetrt/values/arrays.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[3])

# argv: a cache base directory. Prints {feature: [exception class, is an ImportError, message]}.
WITHOUT = textwrap.dedent("""
    import json, sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "ray", "jax"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Refuse())
    import numpy as np
    import datasetrt as drt
    import datasetrt.ray
    from datasetrt.sources import NumpySource

    config = drt.WriterConfig(show_progress=False)
    source = NumpySource("tiny", np.arange(40, dtype=np.int32).reshape(10, 4), index_column="i")
    with drt.DatasetRuntime(num_workers=1) as rt:
        [result] = rt.write_cache([source], sys.argv[1], writer_config=config)
    ds = drt.CachedDataset([result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False), runtime=None)
    batch = next(iter(ds.iter_batches(4)))
    calls = {
        "to_torch_iterable_dataset": ds.to_torch_iterable_dataset,
        "to_torch_dataloader": lambda: ds.to_torch_dataloader(batch_size=2),
        "to_torch_batches": lambda: ds.to_torch_batches(4),
        "batch.to_torch": batch.to_torch,
        "batch.to_jax": batch.to_jax,
        "ray.write_caches": lambda: datasetrt.ray.write_caches(None, sys.argv[1], rows_per_cache=3),
    }
    out = {"read": [s.sample_id for s in ds]}
    for feature, call in calls.items():
        try:
            call()
        except Exception as exc:
            out[feature] = [type(exc).__name__, isinstance(exc, ImportError), str(exc)]
    batch.release()
    ds.close()
    print(json.dumps(out))
""")


def test_features_without_their_extra_raise_missing_extra_error_naming_the_feature(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out.pop("read") == list(range(10))
    torch_hint, ray_hint = "pip install 'datasetrt[torch]'", "pip install 'datasetrt[ray]'"
    for method in ("to_torch_iterable_dataset", "to_torch_dataloader", "to_torch_batches"):
        # dataset-rt's wording ("CachedDataset.to_torch_iterable_dataset requires PyTorch to be
        # installed"), naming the method that was called
        assert out[method] == [
            "MissingExtraError",
            True,
            f"CachedDataset.{method} requires PyTorch to be installed: {torch_hint}",
        ]
    name, is_import_error, message = out["batch.to_torch"]
    assert (name, is_import_error) == ("MissingExtraError", True) and message.endswith(torch_hint), message
    assert message.startswith("SampleBatch.to_torch requires PyTorch"), message
    assert out["batch.to_jax"] == [
        "MissingExtraError",
        True,
        "SampleBatch.to_jax requires JAX: pip install 'datasetrt[jax]'",
    ]
    assert out["ray.write_caches"] == [
        "MissingExtraError",
        True,
        f"datasetrt.ray.write_caches requires Ray Data to be installed: {ray_hint}",
    ]
