"""OpenAI-style error bodies for the HTTP routes: ``{"error": {"message", "type", "param", "code"}}`` (the engine's
own refusals, the exceptions they map from, are :mod:`atom_engine.errors`)."""

from __future__ import annotations

from aiohttp import web

TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error",
         500: "internal_error", 503: "service_unavailable_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 err_type: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.err_type = status, message, param, code, err_type

    def response(self) -> web.Response:
        return error_response(self.status, self.message, param=self.param, code=self.code, err_type=self.err_type)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None,
               err_type: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type or TYPES.get(status, "error"), "param": param,
                      "code": code if code is not None else str(status)}}


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   err_type: str | None = None) -> web.Response:
    return web.json_response(error_body(status, message, param=param, code=code, err_type=err_type), status=status)
