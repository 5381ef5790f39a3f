"""One small interface over a local folder and an S3 prefix.

Keys are relative, '/'-separated paths under the store's root. Local writes are atomic (a
temporary name, then a rename); on S3 each object appears whole when its upload completes, so
multi-object commits are made visible by writing a marker object last (the Checkpointer does).
S3 uses boto3 with the usual AWS credential chain; `endpoint_url` (or AWS_ENDPOINT_URL) points
it at any S3-compatible store. Transient errors are retried with backoff by botocore, then
reported as StorageError naming the operation and the key.
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from storage.atomic import replace_dir, temp_beside, write_atomic


class StorageError(RuntimeError):
    pass


def is_s3(path: str) -> bool:
    return str(path).startswith("s3://")


def split_s3(url: str) -> tuple[str, str]:
    rest = url[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise StorageError(f"'{url}' names no bucket; expected s3://bucket/prefix")
    return bucket, prefix.strip("/")


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p)


def _check_key(key: str) -> str:
    parts = key.replace("\\", "/").split("/")
    if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid storage key '{key}'")
    return "/".join(parts)


class LocalStore:
    def __init__(self, root: str):
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data, durable=True)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StorageError(f"'{self._path(key)}' does not exist") from None

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list_dirs(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))

    def list_files(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())

    def upload_dir(self, local_dir: str, key: str, last: str | None = None) -> None:
        """Copy a folder in under `key`, visible only when complete (temporary name, rename; `last`, the
        file S3 writes last so that readers gated on it see all or nothing, needs no order here)."""
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_beside(dest)
        shutil.copytree(local_dir, tmp)
        replace_dir(tmp, dest)

    def download_dir(self, key: str, local_dir: str, only=None) -> str:
        """Copy the folder `key` to local_dir; `only(relative path)` picks the files (default: all)."""
        src = self._path(key) if key else self.root
        if not src.is_dir():
            raise StorageError(f"'{src}' is not a folder")
        for rel in self.list_files(key):
            if only is None or only(rel):
                (Path(local_dir) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, Path(local_dir) / rel)
        return local_dir

    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.is_dir():
            # rename first so a half-deleted folder is never mistaken for a checkpoint
            doomed = path.with_name(f".{path.name}.{uuid.uuid4().hex}.del")
            os.replace(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        elif path.exists():
            path.unlink()

    def local_path(self, key: str) -> str:
        return str(self._path(key))


class S3Store:
    def __init__(self, url: str, endpoint_url: str | None = None, region: str | None = None,
                 max_attempts: int = 5, timeout_s: float = 60.0):
        import boto3
        from botocore.config import Config as BotoConfig

        self.url = url.rstrip("/")
        self.bucket, self.prefix = split_s3(url)
        self.client = boto3.client(
            "s3", endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
            region_name=region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            config=BotoConfig(retries={"max_attempts": max_attempts, "mode": "standard"},
                              connect_timeout=min(timeout_s, 10.0), read_timeout=timeout_s))

    def _key(self, key: str) -> str:
        key = _check_key(key) if key else ""
        return f"{self.prefix}/{key}".strip("/") if self.prefix else key

    def _call(self, what: str, key: str, fn, *args, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            return fn(*args, **kwargs)
        except (BotoCoreError, ClientError) as e:
            raise StorageError(f"S3 {what} of s3://{self.bucket}/{self._key(key)} failed: {e}") from None

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call("upload", key, self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        from botocore.exceptions import ClientError
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise StorageError(f"s3://{self.bucket}/{self._key(key)} does not exist") from None
            raise StorageError(f"S3 download of s3://{self.bucket}/{self._key(key)} failed: {e}") from None
        except Exception as e:
            raise StorageError(f"S3 download of s3://{self.bucket}/{self._key(key)} failed: {e}") from None

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise StorageError(f"S3 lookup of s3://{self.bucket}/{self._key(key)} failed: {e}") from None
        except Exception as e:
            raise StorageError(f"S3 lookup of s3://{self.bucket}/{self._key(key)} failed: {e}") from None

    def _list(self, prefix: str, delimiter: str | None):
        base = self._key(prefix)
        base = base + "/" if base else ""
        kwargs = {"Bucket": self.bucket, "Prefix": base}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        pages = self._call("listing", prefix, lambda: list(self.client.get_paginator("list_objects_v2").paginate(**kwargs)))
        return base, pages

    def list_dirs(self, prefix: str = "") -> list[str]:
        base, pages = self._list(prefix, "/")
        return sorted({p["Prefix"][len(base):].strip("/") for page in pages for p in page.get("CommonPrefixes", [])})

    def list_files(self, prefix: str) -> list[str]:
        base, pages = self._list(prefix, None)
        return sorted(o["Key"][len(base):] for page in pages for o in page.get("Contents", []))

    def upload_dir(self, local_dir: str, key: str, last: str | None = None) -> None:
        """Upload a folder's files under `key`; `last` (a relative path) goes after all the others, so a
        reader that waits for it sees the folder whole (each object appears whole when its upload ends)."""
        files = sorted(Path(local_dir).rglob("*"), key=lambda p: (p.relative_to(local_dir).as_posix() == last, p))
        for path in files:
            if path.is_file():
                rel = join(key, path.relative_to(local_dir).as_posix())
                self._call("upload", rel, self.client.upload_file, str(path), self.bucket, self._key(rel))

    def download_dir(self, key: str, local_dir: str, only=None) -> str:
        """Download every object under `key` to local_dir; `only(relative path)` picks them (default: all)."""
        files = self.list_files(key)
        if not files:
            raise StorageError(f"s3://{self.bucket}/{self._key(key)}/ holds no objects")
        for rel in files:
            if only is not None and not only(rel):
                continue
            _check_key(rel)
            dest = Path(local_dir) / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = temp_beside(dest)
            self._call("download", join(key, rel), self.client.download_file, self.bucket,
                       self._key(join(key, rel)), str(tmp))
            os.replace(tmp, dest)
        return local_dir

    def delete(self, key: str) -> None:
        keys = [join(key, f) for f in self.list_files(key)]
        for i in range(0, len(keys), 1000):
            objs = [{"Key": self._key(k)} for k in keys[i:i + 1000]]
            self._call("delete", key, self.client.delete_objects, Bucket=self.bucket, Delete={"Objects": objs})
        if self.exists(key):
            self._call("delete", key, self.client.delete_object, Bucket=self.bucket, Key=self._key(key))


def open_store(path: str, s3_cfg=None):
    """A LocalStore for a folder, an S3Store for s3://bucket/prefix (settings.schema.S3Config)."""
    if is_s3(path):
        return S3Store(path, endpoint_url=getattr(s3_cfg, "endpoint_url", None),
                       region=getattr(s3_cfg, "region", None), max_attempts=getattr(s3_cfg, "max_attempts", 5),
                       timeout_s=getattr(s3_cfg, "timeout_s", 60.0))
    return LocalStore(path)
