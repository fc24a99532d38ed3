"""API errors, by what the caller should do about them (never by comparing strings).

ApiError                      any non-2xx answer or failed exchange; .status, .reason
 +-- ApiNotFoundError         404: the object is gone
 +-- ApiConflictError         409: a precondition or concurrent write
 +-- ApiGoneError             410: resourceVersion too old; relist
 +-- ApiTransientError        5xx, 429, timeouts, connection failures: retry later
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


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
