"""Without an extra's packages datasetrt imports and works; the feature that needs them raises
MissingExtraError naming the extra. Each check runs in a fresh interpreter in which the optional
module is hidden (`sys.modules[name] = None` makes every import of it fail, as if not installed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.packaging.conftest import ROOT

# argv: cache base dir. Writes and reads a small cache with torch hidden, then asks for a loader.
WITHOUT_TORCH = textwrap.dedent("""
    import json, sys
    sys.modules["torch"] = None
    import datasetrt as drt
    from datasetrt import errors
    from datasetrt.cli import main as cli_main

    class Source:
        name = "tiny"
        def __iter__(self):
            for i in range(20):
                yield drt.CacheInput(bytes([i]) * i, {"i": i})

    with drt.DatasetRuntime(num_workers=1) as rt:
        [res] = rt.write_cache(Source(), sys.argv[1], writer_config=drt.WriterConfig(show_progress=False))
        ds = rt.cached_dataset([res.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False))
        read = [s.data == bytes([s.sample_id]) * s.sample_id for s in ds]
        out = {"read": len(read), "ok": all(read)}
        for feature in ("to_torch_dataloader", "to_torch_iterable_dataset"):
            try:
                getattr(ds, feature)()
            except errors.MissingExtraError as exc:
                out[feature] = [isinstance(exc, ImportError), str(exc)]
        try:  # the package imports without torch (its plan module is torch-free); its torch names do not
            from datasetrt.integrations.torch import to_torch_dataloader
        except errors.MissingExtraError as exc:
            out["import"] = str(exc)
        ds.close()
    out["cli"] = cli_main(["inspect", str(res.path), "--json"])
    print(json.dumps(out))
""")


def test_without_torch_the_core_works_and_torch_features_name_the_extra(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, str(tmp_path)], cwd=ROOT, text=True, capture_output=True, check=True
    )
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["read"] == 20 and out["ok"]
    hint = "pip install 'datasetrt[torch]'"
    for feature in ("to_torch_dataloader", "to_torch_iterable_dataset"):
        is_import_error, message = out[feature]
        assert is_import_error and message.endswith(hint), (feature, message)
        assert message.startswith(f"CachedDataset.{feature} requires PyTorch to be installed")
    assert out["import"].endswith(hint)
    assert out["cli"] == 0
