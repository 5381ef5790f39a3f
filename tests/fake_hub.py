"""A local stand-in for the Hugging Face Hub: the few HTTP endpoints snapshot_download uses.

It serves one folder as repo `<org>/<name>` at a fixed commit, so the hub-loading path of
vlm/load.py runs the real huggingface_hub code against a real HTTP server.
"""
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repo_id: str, folder: str):
        self.repo_id, self.folder = repo_id, Path(folder)
        self.files = sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*") if p.is_file())
        self.requests = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", headers=None, head=False):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _route(self, head):
                path = unquote(urlparse(self.path).path)
                hub.requests.append((self.command, path))
                api = f"/api/models/{hub.repo_id}"
                if path.startswith(api + "/tree/"):
                    entries = [{"type": "file", "path": f, "size": (hub.folder / f).stat().st_size,
                                "oid": hashlib.sha1((hub.folder / f).read_bytes()).hexdigest()} for f in hub.files]
                    return self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
                if path.startswith(api + "/revision/") or path == api:
                    info = {"id": hub.repo_id, "modelId": hub.repo_id, "sha": COMMIT,
                            "siblings": [{"rfilename": f} for f in hub.files]}
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
                prefix = f"/{hub.repo_id}/resolve/"
                if path.startswith(prefix):
                    rev, _, name = path[len(prefix):].partition("/")
                    f = hub.folder / name
                    if name in hub.files:
                        data = f.read_bytes()
                        return self._send(200, data, {"X-Repo-Commit": COMMIT,
                                                      "ETag": '"' + hashlib.sha256(data).hexdigest() + '"'}, head)
                return self._send(404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"}, head)

            def do_GET(self):
                self._route(head=False)

            def do_HEAD(self):
                self._route(head=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
