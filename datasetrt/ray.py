"""`datasetrt.ray`: cache builds on a Ray cluster (the `ray` extra: `pip install datasetrt[ray]`).

Boundary: re-exports `datasetrt.integrations.ray` (Ray itself is imported when a build starts).
"""

from datasetrt.integrations.ray import RayBuild, fingerprint, write_caches

__all__ = ["RayBuild", "fingerprint", "write_caches"]
