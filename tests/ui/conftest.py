from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.service.main import create_app
from app.service.settings import load_settings
from tests.api.conftest import write_snapshot
from tests.api.server import RunningServer, running

ServeSnapshot = Callable[..., RunningServer]


@contextmanager
def snapshot_server(
    directory: Path,
    *,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]] | None = None,
    groups: list[dict[str, Any]] | None = None,
) -> Iterator[RunningServer]:
    """The real app over HTTP on a snapshot; ``groups`` may hold PodGroups and IPPools
    (``{"kind": "IPPool", **make_ip_pool(...)}``)."""
    snapshot = write_snapshot(directory / "snapshot.json", nodes, pods or [], groups or [])
    with running(create_app(load_settings(snapshot=snapshot))) as server:
        page = httpx.get(f"{server.url}/ui", timeout=10)
        assert page.status_code == 200, (
            f"GET /ui answered {page.status_code}: create_app in app/service/main.py must include "
            "app.service.routes.ui.router"
        )
        yield server


@pytest.fixture
def serve_snapshot(tmp_path: Path) -> Iterator[ServeSnapshot]:
    """``serve_snapshot(nodes=[...], pods=[...], groups=[...])`` starts a server that stops
    with the test."""
    with ExitStack() as stack:
        yield lambda **parts: stack.enter_context(snapshot_server(tmp_path, **parts))
