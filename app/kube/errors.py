"""API errors, by what the caller should do about them (never by comparing strings).

ApiError                      any non-2xx answer or failed exchange; .status, .reason
 +-- ApiNotFoundError         404: the object is gone
 +-- ApiConflictError         409: a precondition or concurrent write
 +-- ApiGoneError             410: resourceVersion too old; relist
 +-- ApiTransientError        5xx, 429, timeouts, connection failures: retry later

For a write, ``ApiError.maybe_written`` says whether the server may have applied it although
no success came back: a timeout or a connection lost after sending, or a 500/504.
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(
        self, message: str, *, status: int = 0, reason: str = "", sent: bool = True
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.sent = sent  # False: no connection was made, nothing reached the server

    @property
    def maybe_written(self) -> bool:
        """No answer after the request went out, or a server error that may follow a write
        (500, 504); never a refusal, a 429 or a 503 (the server did not take it on)."""
        return (self.status == 0 and self.sent) or self.status in (500, 504)


class ApiNotFoundError(ApiError):
    pass


class ApiConflictError(ApiError):
    pass


class ApiGoneError(ApiError):
    pass


class ApiTransientError(ApiError):
    pass


def error_for(status: int, message: str, reason: str = "") -> ApiError:
    kind: type[ApiError]
    if status == 404:
        kind = ApiNotFoundError
    elif status == 409:
        kind = ApiConflictError
    elif status == 410:
        kind = ApiGoneError
    elif status == 429 or status >= 500:
        kind = ApiTransientError
    else:
        kind = ApiError
    return kind(message, status=status, reason=reason)
