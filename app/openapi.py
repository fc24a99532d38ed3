"""OpenAPI descriptions of the extender verbs' bodies.

The verbs read the raw body themselves (any key case, specific error messages, no 422 pages),
so FastAPI cannot infer their schemas; these describe them for clients, docs and the fuzz
tests (which generate requests from them)."""

from __future__ import annotations

from typing import Any

__all__ = ["BIND", "EXTENDER_ARGS", "PREEMPTION_ARGS"]

_OBJECT = {"type": "object", "additionalProperties": True}
_NULLABLE_OBJECT = {"anyOf": [_OBJECT, {"type": "null"}]}


def _body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": schema}},
        }
    }


EXTENDER_ARGS = _body(
    {
        "type": "object",
        "properties": {
            "Pod": _OBJECT,
            "Nodes": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"items": {"type": "array", "items": _OBJECT}},
                    },
                    {"type": "null"},
                ]
            },
            "NodeNames": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
            },
        },
        "required": ["Pod"],
    },
    "k8s.io/kube-scheduler/extender/v1 ExtenderArgs: NodeNames (nodeCacheCapable) or Nodes.",
)

PREEMPTION_ARGS = _body(
    {
        "type": "object",
        "properties": {
            "Pod": _OBJECT,
            "NodeNameToVictims": _NULLABLE_OBJECT,
            "NodeNameToMetaVictims": {
                "anyOf": [
                    {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {
                                "Pods": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {"UID": {"type": "string"}},
                                    },
                                },
                                "NumPDBViolations": {"type": "integer", "minimum": 0},
                            },
                        },
                    },
                    {"type": "null"},
                ]
            },
        },
        "required": ["Pod"],
    },
    "ExtenderPreemptionArgs: victims as full pods or by UID; answered as NodeNameToMetaVictims.",
)

BIND = _body(
    {
        "type": "object",
        "properties": {
            "PodName": {"type": "string"},
            "PodNamespace": {"type": "string"},
            "PodUID": {"type": "string"},
            "Node": {"type": "string"},
        },
        "required": ["PodName", "PodNamespace", "PodUID", "Node"],
    },
    "ExtenderBindingArgs.",
)
