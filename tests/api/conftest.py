from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from app.service.main import create_app
from app.service.settings import load_settings
from tests.api.server import RunningServer, running

FIXTURES = Path(__file__).parent.parent / "fixtures"

Serve = Callable[..., RunningServer]


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def write_snapshot(
    path: Path,
    nodes: list[dict[str, Any]],
    pods: Sequence[dict[str, Any]] = (),
    groups: Sequence[dict[str, Any]] = (),
) -> Path:
    items = [{"kind": "Node", **n} for n in nodes] + [{"kind": "Pod", **p} for p in pods]
    items += list(groups)
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Start the app over real HTTP: ``serve()`` for the demo inventory,
    ``serve(nodes=[...], pods=[...])`` for a snapshot, ``settings=`` for overrides."""
    stack = ExitStack()

    def start(
        *,
        nodes: list[dict[str, Any]] | None = None,
        pods: list[dict[str, Any]] | None = None,
        groups: list[dict[str, Any]] | None = None,
        settings: dict[str, Any] | None = None,
        **app_kwargs: Any,
    ) -> RunningServer:
        overrides = dict(settings or {})
        if nodes is not None:
            overrides["snapshot"] = write_snapshot(
                tmp_path / "snapshot.json", nodes, pods or [], groups or []
            )
        app = create_app(load_settings(**overrides), **app_kwargs)
        return stack.enter_context(running(app))

    with stack:
        yield start


@pytest.fixture
def demo(serve: Serve) -> RunningServer:
    return serve()


@pytest.fixture
def full_demo(serve: Serve) -> RunningServer:
    """The demo in full mode (policy.shortlist 0): filter answers every feasible node and
    every rejected one with its reason, as kube-scheduler gets it with prioritizeVerb."""
    return serve(settings={"policy": {"shortlist": 0}})
