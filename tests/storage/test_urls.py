"""storage/urls.py: local paths stay Paths, URLs become RemoteLocations with one canonical form."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from datasetrt.errors import ConfigError
from datasetrt.storage.urls import RemoteLocation, is_url, parse_location, parse_remote, relative_name


@pytest.mark.parametrize("value", ["caches/a", "/tmp/caches/a", "./a", "a b/c", "~/x", "s3", "s3_bucket/x"])
def test_local_paths_are_the_paths_they_always_were(value):
    assert parse_location(value) == Path(value)
    assert parse_location(Path(value)) == Path(value)


def test_file_urls_are_local_paths_percent_decoded():
    assert parse_location("file:///tmp/caches/a") == Path("/tmp/caches/a")
    assert parse_location("file://localhost/tmp/a%20b") == Path("/tmp/a b")
    for bad in ("file://otherhost/tmp/a", "file://", "file:///tmp/a?x=1"):
        with pytest.raises(ConfigError, match="file"):
            parse_location(bad)


@pytest.mark.parametrize(
    ("value", "scheme", "bucket", "prefix"),
    [
        ("s3://bkt/caches/a", "s3", "bkt", "caches/a"),
        ("s3://bkt/caches/a/", "s3", "bkt", "caches/a"),
        ("S3://bkt/caches/a", "s3", "bkt", "caches/a"),
        ("s3a://bkt/caches/a", "s3", "bkt", "caches/a"),
        ("s3://bkt", "s3", "bkt", ""),
        ("s3://bkt/", "s3", "bkt", ""),
        ("s3://my.bucket-1/a%20b", "s3", "my.bucket-1", "a%20b"),
        ("gs://bkt/p", "gs", "bkt", "p"),
        ("gcs://bkt/p", "gs", "bkt", "p"),
        ("az://container/p/q", "az", "container", "p/q"),
        ("azure://container/p", "az", "container", "p"),
        ("abfss://fs@acct.dfs.core.windows.net/p", "abfss", "fs@acct.dfs.core.windows.net", "p"),
    ],
)
def test_urls_parse_into_scheme_bucket_prefix(value, scheme, bucket, prefix):
    location = parse_location(value)
    assert location == RemoteLocation(scheme, bucket, prefix)
    assert parse_location(location.url) == location  # the canonical URL parses back to itself


def test_trailing_slash_is_the_same_cache_and_keys_join():
    a, b = parse_remote("s3://b/p/"), parse_remote("s3://b/p")
    assert a == b and a.url == b.url == "s3://b/p" and hash(a) == hash(b)
    assert a.key("shards/000000.bin") == "p/shards/000000.bin"
    assert a.url_of("manifest.json") == "s3://b/p/manifest.json"
    assert a.child("c1").url == "s3://b/p/c1" and a.child("c1").name == "c1"
    root = parse_remote("s3://b")
    assert root.key("manifest.json") == "manifest.json" and root.url == "s3://b" and root.name == ""


@pytest.mark.parametrize(
    "value",
    [
        "s3://",
        "s3:///p",
        "s3://b//p",
        "s3://b/p//q",
        "s3://b/./p",
        "s3://b/../p",
        "s3://b/p?versionId=1",
        "s3://b/p#frag",
        "s3://b/p q",
        "s3://b/p\\q",
        "s3://b/p\x00",
        "s3://-bad/p",
        "s3://b@x/p",
        "ftp://host/p",
        "http://host/p",
    ],
)
def test_malformed_or_unsupported_urls_are_refused_naming_them(value):
    with pytest.raises(ConfigError) as info:
        parse_location(value)
    assert repr(value)[1:-1][:10] in str(info.value) or value in str(info.value)


def test_a_url_mangled_by_pathlib_is_refused_not_read_as_a_directory():
    mangled = Path("s3://bkt/caches/a")
    assert str(mangled) == "s3:/bkt/caches/a"  # what the issue reports Path does
    for value in (mangled, str(mangled), "gs:/b/x", "file:/tmp/x"):
        with pytest.raises(ConfigError, match="lost a slash"):
            parse_location(value)


def test_a_remote_location_refuses_to_become_a_path():
    location = parse_remote("s3://b/p")
    with pytest.raises(TypeError, match="not a local path"):
        os.fspath(location)
    with pytest.raises(TypeError):
        Path(location)
    assert str(location) == "s3://b/p"


def test_relative_names_inside_a_cache():
    assert relative_name("shards/000000.bin") == "shards/000000.bin"
    for bad in ("", "/abs", "a//b", "../x", "a/./b", "a/", "a\\b", "a\x01"):
        with pytest.raises(ConfigError, match="invalid file name"):
            relative_name(bad)
    with pytest.raises(ConfigError):
        parse_remote("s3://b/p").key("../escape")


def test_is_url_and_parse_remote():
    assert is_url("s3://b/p") and is_url("file:///x") and not is_url("/tmp/x") and not is_url(Path("x"))
    with pytest.raises(ConfigError, match="not an object-store URL"):
        parse_remote("/tmp/x")
    with pytest.raises(ConfigError, match="str or os.PathLike"):
        parse_location(42)  # type: ignore[arg-type]
