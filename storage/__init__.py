"""Where checkpoints, exports, adapters and models live: a local folder or s3://bucket/prefix."""
from storage.store import LocalStore, S3Store, StorageError, is_s3, open_store

__all__ = ["LocalStore", "S3Store", "StorageError", "is_s3", "open_store"]
