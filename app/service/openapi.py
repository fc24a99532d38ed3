"""OpenAPI descriptions of the extender verbs.

The verbs are a bare ASGI layer in front of FastAPI that reads the raw body itself (any key
case, specific error messages, no 422 pages), so FastAPI neither routes nor describes them;
these path items do, for clients, docs and the fuzz tests (which generate requests from
them)."""

from __future__ import annotations

from typing import Any

__all__ = ["BIND", "EXTENDER_ARGS", "PREEMPTION_ARGS", "verb_paths"]

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


_JSON_ANSWER = {"content": {"application/json": {"schema": _OBJECT}}}
_VERBS: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "filter": (
        EXTENDER_ARGS,
        "Nodes that can host the pod; a reason for each that cannot (ExtenderFilterResult).",
        {"200": {"description": "ExtenderFilterResult; failures in its Error field"}},
    ),
    "prioritize": (
        {
            **EXTENDER_ARGS,
            "parameters": [
                {
                    "name": "full",
                    "in": "query",
                    "required": False,
                    "description": "1 (or true): every host with its absolute score; 0 (or "
                    "false): the hosts above the lowest score, lowered by it, as kube-scheduler "
                    "reads it. Absent: server.prioritize_full (default: 0).",
                    "schema": {"type": "string", "enum": ["1", "0", "true", "false"]},
                }
            ],
        },
        "A score of 0-10 for the nodes (HostPriorityList).",
        {
            "200": {"description": "HostPriorityList"},
            "400": {"description": "a body that is not ExtenderArgs, or an invalid pod: {Error}"},
            "503": {"description": "inventory not synced or not the leader: {Error}"},
        },
    ),
    "preempt": (
        PREEMPTION_ARGS,
        "Candidate nodes whose victims free what the pod needs (ExtenderPreemptionResult).",
        {
            "200": {"description": "ExtenderPreemptionResult, always NodeNameToMetaVictims"},
            "400": {
                "description": "a body that is not ExtenderPreemptionArgs, or an invalid pod: "
                "{Error}"
            },
            "503": {"description": "inventory not synced or not the leader: {Error}"},
        },
    ),
    "bind": (
        BIND,
        "Choose the GPU indices and address, and bind the pod (ExtenderBindingResult).",
        {"200": {"description": "ExtenderBindingResult; failures in its Error field"}},
    ),
}


def verb_paths(prefix: str = "") -> dict[str, Any]:
    """OpenAPI path items of ``POST /<verb>``, and of ``<prefix>/<verb>`` when set."""
    paths: dict[str, Any] = {}
    for base in ("", prefix) if prefix else ("",):
        for verb, (body, summary, answers) in _VERBS.items():
            operation = {
                "summary": summary,
                "operationId": f"{verb}{base.replace('/', '_')}",
                **body,
                "responses": {
                    status: {**answer, **_JSON_ANSWER} for status, answer in answers.items()
                },
            }
            paths[f"{base}/{verb}"] = {"post": operation}
    return paths
