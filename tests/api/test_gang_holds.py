"""A hold recorded on its PodGroup stands from a replica's first verb on (docs/gangs.md), not
from its first review of the holds, a second after it became ready: meanwhile the small pods
kube-scheduler retries would take the GPUs kept for the gang."""

from __future__ import annotations

import time
from typing import Any

import orjson

from extender import names
from extender.gang.holds import Hold, hold_record
from testbed.builders import gang_pod, make_node, make_pod, make_pod_group
from tests.api.conftest import Serve


def test_a_recorded_hold_keeps_small_pods_off_from_the_first_filter(serve: Serve) -> None:
    now = time.time()
    hold = Hold(
        group="default/g", priority=0, need=(("n1", 8), ("n2", 8)),
        started=now - 30, expires=now + 600, waiting_since=now - 90,
    )  # fmt: skip
    busy: list[dict[str, Any]] = [
        make_pod(f"s{i}", gpus=1, node="n1", phase="Running") for i in range(4)
    ]
    recorded = make_pod_group("g", min_member=2, annotations={names.GANG_HOLD: hold_record(hold)})
    server = serve(
        nodes=[make_node("n1", gpus=8), make_node("n2", gpus=8)],
        pods=[*busy, *(gang_pod(f"m{i}", "g", gpus=8) for i in range(2))],
        groups=[recorded],
    )
    body = {"Pod": make_pod("new", gpus=1), "NodeNames": ["n1", "n2"]}
    with server.client() as client:  # at once: before the first review of the holds
        answer = client.post("/filter", content=orjson.dumps(body)).json()
    assert not answer.get("NodeNames"), answer
    assert "held for gang default/g" in str(answer), answer
