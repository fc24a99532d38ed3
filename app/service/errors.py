"""Errors of the extender service (``app.service``).

    Exception
     +-- RequestRejectedError       a request we refuse to answer as asked; has an HTTP status
     |    +-- WireError             body is not the protocol's shape (400)     [app.service.wire]
     |    +-- InvalidPodError       the pod's request cannot be read (400): prioritize, preempt
     |    +-- BodyTooLargeError     body over server.max_body_bytes (413)
     |    +-- EncodingError         a Content-Encoding other than identity (415)
     |    +-- BodyTimeoutError      body not received within server.body_timeout_s (408)
     |    +-- ClientGoneError       client disconnected before its whole body (400)
     |    +-- NotReadyError         inventory not synced / not the leader (503)
     +-- BindError                  the binder could not bind (reported in Error) [app.kube.binding]

Filter and bind report these in the protocol's ``Error`` field with HTTP 200 (what
kube-scheduler reads); prioritize and preempt, whose results have no such field, answer the
status with ``{"Error": message}``.
"""

from __future__ import annotations


class RequestRejectedError(Exception):
    status = 400


class InvalidPodError(RequestRejectedError):
    """A pod whose resources or schedext annotations cannot be read; the message is the
    reason filter gives for it on every node."""

    status = 400


class BodyTooLargeError(RequestRejectedError):
    status = 413


class EncodingError(RequestRejectedError):
    """A body sent with a Content-Encoding (gzip...): the verbs read plain JSON only."""

    status = 415


class BodyTimeoutError(RequestRejectedError):
    status = 408


class ClientGoneError(RequestRejectedError):
    status = 400


class NotReadyError(RequestRejectedError):
    status = 503
