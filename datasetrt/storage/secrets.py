"""Credential values and their redaction from text.

Boundary: strings only; knows which option and environment-variable names hold credentials,
nothing of stores or requests.

A name holds a credential when it contains key, secret, token, password, sas or credential
(case-insensitive): storage options as given, and environment variables of the store families
(AWS_*, GOOGLE_*, GCS_*, AZURE_*, OBJECT_STORE_*). Values shorter than six characters ("true",
"1") are not credentials and would garble every message they occur in, so they are not redacted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_WORDS = ("key", "secret", "token", "password", "sas", "credential")
SECRET_ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCS_", "AZURE_", "OBJECT_STORE_")
MIN_SECRET_LEN = 6


def is_secret_name(name: str) -> bool:
    low = name.lower()
    return any(word in low for word in SECRET_WORDS)


def secret_values(storage_options: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Every credential-like value of `storage_options` and of the environment's store variables."""
    environ = os.environ if environ is None else environ
    found = {v for k, v in storage_options.items() if is_secret_name(str(k)) and isinstance(v, str)}
    found |= {v for k, v in environ.items() if k.startswith(SECRET_ENV_PREFIXES) and is_secret_name(k)}
    return frozenset(v for v in found if len(v) >= MIN_SECRET_LEN)


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with each secret value replaced by ***."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
