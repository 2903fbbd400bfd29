"""Credentials never appear in a message, a repr, a traceback or a log record."""

from __future__ import annotations

import logging
import pickle
import traceback

import pytest

from datasetrt.errors import ConfigError, StorageError
from datasetrt.storage.objects import ObjectStore
from datasetrt.storage.secrets import redact, secret_values
from datasetrt.storage.urls import parse_remote
from tests.servers.moto import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, s3_options
from tests.servers.proxy import FaultProxy
from tests.storage.conftest import FAST

TOKEN = "dsrt-fake-session-token-77aa"
ENV_KEY_ID = "AKIADATASETRTENV0002"
ENV_SECRET = "dsrt-env-secret-5e6f7a8b9c"


def _failures(store: ObjectStore, proxy: FaultProxy):
    """Every kind of failure the store can raise, as exceptions."""
    errors = []
    proxy.fail("caches/a/x.bin", status=503, times=None)
    proxy.fail("caches/a/denied.bin", status=403, times=None)
    for call in (
        lambda: store.get("missing.bin", max_bytes=1),
        lambda: store.get("x.bin", max_bytes=1),
        lambda: store.head("denied.bin"),
        lambda: store.put("denied.bin", b"x"),
    ):
        with pytest.raises(StorageError) as info:
            call()
        errors.append(info.value)
    proxy.stop()
    with pytest.raises(StorageError) as info:
        store.head("any.bin")
    errors.append(info.value)
    proxy.start()
    return errors


def _text_of(exc: BaseException) -> str:
    copy = pickle.loads(pickle.dumps(exc))
    return "\n".join(
        (str(exc), repr(exc), "".join(traceback.format_exception(exc)), str(copy), repr(copy), repr(vars(exc)))
    )


def _assert_clean(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text, f"credential leaked: {text}"


def test_explicit_credentials_never_leak(s3_proxy, bucket, caplog):
    caplog.set_level(logging.DEBUG)
    options = s3_options(s3_proxy.endpoint, session_token=TOKEN)
    store = ObjectStore(parse_remote(f"s3://{bucket}/caches/a"), options, retry=FAST)
    _assert_clean(repr(store) + str(store), FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, TOKEN)
    for error in _failures(store, s3_proxy):
        _assert_clean(_text_of(error), FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, TOKEN)
    _assert_clean(caplog.text, FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, TOKEN)


def test_environment_credentials_never_leak(s3_proxy, bucket, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ENV_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ENV_SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_proxy.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    store = ObjectStore(f"s3://{bucket}/caches/a", retry=FAST)  # everything from the environment
    store.put("ok.bin", b"ok")
    assert store.get("ok.bin", max_bytes=2) == b"ok"
    assert s3_proxy.count("PUT", "caches/a/ok.bin") == 1  # the endpoint came from AWS_ENDPOINT_URL
    for error in _failures(store, s3_proxy):
        _assert_clean(_text_of(error), ENV_KEY_ID, ENV_SECRET)
    _assert_clean(caplog.text, ENV_KEY_ID, ENV_SECRET)


def test_a_server_that_echoes_the_key_id_is_redacted(moto_auth_server, bucket):
    """moto's 403 body names the AWSAccessKeyId it refused; the message must not."""
    store = ObjectStore(parse_remote(f"s3://{bucket}/caches/a"), s3_options(moto_auth_server.endpoint), retry=FAST)
    with pytest.raises(StorageError) as info:
        store.get("manifest.json", max_bytes=10)
    assert "InvalidAccessKeyId" in str(info.value)
    _assert_clean(_text_of(info.value), FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY)


def test_config_errors_never_echo_values(s3_proxy, bucket):
    options = s3_options(s3_proxy.endpoint, region=FAKE_SECRET_ACCESS_KEY + "-x", not_a_key=FAKE_SECRET_ACCESS_KEY)
    with pytest.raises(ConfigError) as info:
        ObjectStore(parse_remote(f"s3://{bucket}/caches/a"), options)
    _assert_clean(_text_of(info.value), FAKE_SECRET_ACCESS_KEY)


def test_secret_values_and_redact():
    secrets = secret_values(
        {"secret_access_key": "abcdef-secret", "region": "us-east-1", "skip_signature": True, "token": "t"},
        {"AWS_SESSION_TOKEN": "tok-123456", "AWS_REGION": "eu-west-1", "HOME": "/root"},
    )
    assert secrets == {"abcdef-secret", "tok-123456"}  # short values ("t") garble nothing and guard nothing
    assert redact("a abcdef-secret b tok-123456", secrets) == "a *** b ***"
