"""API errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or {400: "invalid_request_error", 404: "not_found_error", 413: "request_too_large",
                             415: "invalid_request_error", 500: "server_error",
                             503: "service_unavailable"}.get(status, "error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
