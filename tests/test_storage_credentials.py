"""Credentials that expire mid-run, against the real S3 server of the tests (moto on 127.0.0.1)
behind the proxy of tests/s3_proxy.py, which refuses requests signed with an expired access key
(403 ExpiredToken, as AWS does). The credentials come from boto3's standard chain: a shared
credentials file (AWS_SHARED_CREDENTIALS_FILE) that is rewritten with a new key, as a credential
helper or a rotation job does. The run goes on with every batch equal to the local reference;
with no new key, the error is a PermissionError naming the URL, at once, with no secret in it."""
from __future__ import annotations

import os
import time
import uuid

import pytest

import fastload as fl
from remote_helpers import S3_CLIENTS, batches, copy as _copy, equal as _equal, small_dataset, upload_dir

boto3 = pytest.importorskip("boto3")


OLD_KEY, OLD_SECRET = "AKIAOLDKEY000000TEST", "OLDsecretOLDsecretOLDsecret0123456789"
NEW_KEY, NEW_SECRET = "AKIANEWKEY000000TEST", "NEWsecretNEWsecretNEWsecret0123456789"


def _write_credentials(path, key, secret):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"[default]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
    os.replace(tmp, path)  # as a rotation job does: readers see the old file or the new one


@pytest.fixture
def chain(tmp_path, monkeypatch, s3_server):
    """boto3's chain reads the shared credentials file only (the environment's keys removed)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    creds, config = tmp_path / "credentials", tmp_path / "config"
    config.write_text("[default]\nregion = us-east-1\n")
    _write_credentials(creds, OLD_KEY, OLD_SECRET)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    return creds


@pytest.fixture
def dataset(s3_server, tmp_path):
    """8 shards of 125 rows uploaded to a new bucket: (url, local path, bytes of a shard)."""
    endpoint = s3_server[0]
    local = tmp_path / "ds"
    small_dataset(local, width=8, seed=21)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
                      aws_secret_access_key="setup")
    bucket = f"c-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    upload_dir(s3, bucket, "ds", local)
    shard = os.path.getsize(local / "x" / "000000.npy") + os.path.getsize(local / "y" / "000000.npy")
    return f"s3://{bucket}/ds", str(local), shard


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_key_rotated_mid_run_is_picked_up_and_batches_stay_exact(dataset, chain, s3_proxy, tmp_path, client, capfd):
    url, local, shard = dataset
    opts = {"endpoint_url": s3_proxy.url, "client": client, "backoff": 0.01, "max_backoff": 0.05}
    # A cache of 3 of the 8 shards, read in order: downloads go on after the old key expires.
    ds = fl.Dataset.open(url, storage_options=opts, cache_dir=tmp_path / "cache", cache_limit=3 * shard)
    kw = dict(batch_size=50, num_threads=2)
    reference = batches(fl.Loader(fl.Dataset.open(local), **kw))
    got = []
    with fl.Loader(ds, **kw) as loader:
        for k, batch in enumerate(loader):
            got.append(_copy(batch))
            if k == 3:
                _write_credentials(chain, NEW_KEY, NEW_SECRET)
                s3_proxy.expire(f"Credential={OLD_KEY}/")
    _equal(got, reference)
    assert s3_proxy.refused > 0  # the old key was refused, and the run went on with the new one
    assert ds.storage_stats().bytes_fetched >= 8 * shard
    # A second epoch (evicted shards fetched again) signs with the new key only.
    before = s3_proxy.refused
    _equal(batches(fl.Loader(ds, **kw)), reference)
    assert s3_proxy.refused == before
    out, err = capfd.readouterr()
    for secret in (OLD_SECRET, NEW_SECRET):
        assert secret not in out + err


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_expired_key_with_no_new_one_is_a_clear_permission_error(dataset, chain, s3_proxy, tmp_path, client):
    url, _, shard = dataset
    opts = {"endpoint_url": s3_proxy.url, "client": client, "backoff": 0.01, "max_backoff": 0.05}
    s3_proxy.expire(f"Credential={OLD_KEY}/")
    t0 = time.monotonic()
    with pytest.raises(PermissionError) as info:
        fl.Dataset.open(url, storage_options=opts, cache_dir=tmp_path / "c1")
    text = str(info.value)
    assert f"{url}/manifest.json: access denied (HTTP 403 ExpiredToken)" in text, text
    assert "no new credentials" in text and OLD_SECRET not in text and OLD_KEY not in text
    assert info.value.__cause__ is None and info.value.__context__ is None or OLD_SECRET not in repr(info.value.__context__)

    # Mid-run: the batch that needs a new download fails naming its URL; no hang, no short batch.
    s3_proxy.expired.clear()
    ds = fl.Dataset.open(url, storage_options=opts, cache_dir=tmp_path / "c2", cache_limit=3 * shard)
    with fl.Loader(ds, batch_size=50, num_threads=2) as loader:
        it = iter(loader)
        next(it)
        s3_proxy.expire(f"Credential={OLD_KEY}/")
        with pytest.raises(Exception) as info:  # noqa: PT011 - the loader's wrapper of the source's error
            for _ in it:
                pass
    text = str(info.value) + str(info.value.__cause__ or "")
    assert "access denied (HTTP 403 ExpiredToken)" in text and f"{url}/" in text, text
    assert OLD_SECRET not in text and OLD_KEY not in text
    assert time.monotonic() - t0 < 60


def test_obstore_is_asked_again_before_credentials_expire(chain):
    """obstore keeps credentials until the expiry its callback gives: static ones are handed out
    with a near expiry (so a renewal is seen), temporary ones with theirs."""
    import datetime

    from botocore.credentials import RefreshableCredentials

    from fastload._storage.credentials import Renewable, aws_chain, obstore_s3_provider

    now = datetime.datetime.now(datetime.timezone.utc)
    got = obstore_s3_provider(aws_chain(None))()
    assert got["access_key_id"] == OLD_KEY and now < got["expires_at"] <= now + datetime.timedelta(minutes=5, seconds=1)
    soon = now + datetime.timedelta(seconds=90)
    refreshes = []

    def refresh():
        refreshes.append(1)
        return {"access_key": NEW_KEY, "secret_key": NEW_SECRET, "token": "t", "expiry_time": soon.isoformat()}

    temporary = RefreshableCredentials.create_from_metadata(refresh(), refresh, "test")
    got = obstore_s3_provider(Renewable(lambda: (None, temporary), lambda pair: ("x",)))()
    assert got["access_key_id"] == NEW_KEY and got["token"] == "t" and got["expires_at"] == soon
