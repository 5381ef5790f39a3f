"""A real S3-compatible server on this machine (moto's, in a child process on a free local port): what
the tests, the benchmarks and a laptop trying `s3://` checkpoints or adapters talk to.

    python -m deploy.local_s3            # serve until Ctrl-C; prints the endpoint to pass as s3.endpoint_url
"""
from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout
from net import free_port  # noqa: E402


class S3Server:
    """moto's S3 server on 127.0.0.1; `stop()` ends it (and everything it held)."""

    def __init__(self, port: int | None = None, start_timeout_s: float = 30.0):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(self.url + "/moto-api/", timeout=1)
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's S3 server did not start on {self.url} (is moto[server] installed?)")
                time.sleep(0.1)

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


if __name__ == "__main__":
    server = S3Server()
    print(f"S3 server at {server.url} (any access key; s3.endpoint_url={server.url}); Ctrl-C stops it", flush=True)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        server.stop()
