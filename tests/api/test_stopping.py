"""A stop (SIGTERM) ends the gangs' waits at the bind barrier at once (issue 33, point 20):
a bind waiting for the rest of its group answers that the replica is stopping, rather than
keep the lease while it waits out its timeout."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from testbed.builders import gang_pod, make_node, make_pod_group
from tests.api.conftest import write_snapshot
from tests.api.test_cli import json_lines, schedext_serve


def gang_snapshot(path: Path) -> tuple[Path, dict[str, Any]]:
    member = gang_pod("m0", "g", gpus=1)
    other = gang_pod("m1", "g", gpus=1)
    group = make_pod_group("g", min_member=2, timeout_s=60)
    return write_snapshot(path, [make_node("n1", gpus=4)], [member, other], [group]), member


def waiting_groups(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("schedext_gangs_waiting "):
            return float(line.split()[1])
    return 0.0


def test_a_stop_ends_a_bind_waiting_at_the_barrier_with_a_reason(
    tmp_path: Path,
) -> None:
    snapshot, member = gang_snapshot(tmp_path / "cluster.json")
    meta = member["metadata"]
    answers: list[dict[str, Any]] = []
    with schedext_serve(
        "--snapshot", str(snapshot), "--log-level", "info",
    ) as served:  # fmt: skip
        filtered = httpx.post(
            f"{served.url}/filter", json={"Pod": member, "NodeNames": ["n1"]}
        ).json()
        assert filtered["NodeNames"] == ["n1"]
        bind = {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"], "Node": "n1"}  # fmt: skip

        def call() -> None:
            answers.append(httpx.post(f"{served.url}/bind", json=bind, timeout=60).json())

        waiter = threading.Thread(target=call)
        waiter.start()
        deadline = time.monotonic() + 20
        while waiting_groups(served.url) < 1:  # the member waits for the other at the barrier
            assert time.monotonic() < deadline, "the bind never reached the barrier"
            time.sleep(0.05)
        logs = json_lines(served.stop())
        waiter.join(timeout=30)
    assert not waiter.is_alive()
    (answer,) = answers
    # Not the group's timeout (60 s): the stop ended the wait, and says so.
    assert "this replica is stopping" in answer["Error"], answer
    stopping = [line for line in logs if line.get("message") == "stopping"]
    assert stopping, [line.get("message") for line in logs]
    assert stopping[0]["gang_waits_ended"] == ["default/g"]
