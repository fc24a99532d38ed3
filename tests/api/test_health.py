"""Readiness as a standby replica sees it: every check of /readyz by name, so that a pod's
readinessProbe can ask "synced" (both replicas pass) while the verbs need "leader" too."""

from __future__ import annotations

import orjson

from app.service import Service
from tests.api.conftest import Serve, fixture

NOT_LEADER = "not the leader (the leader is schedext-0_ab12)"


class StandbySource:
    """A synced inventory whose replica does not hold the lease."""

    description = "a standby replica"

    async def start(self, service: Service) -> None:
        service.readiness.set_ready()
        service.readiness.set_leading(False, "schedext-0_ab12")

    async def stop(self) -> None:
        return None


def test_a_standby_is_synced_but_not_ready_to_answer_verbs(serve: Serve) -> None:
    with serve(source=StandbySource()).client() as client:
        ready = client.get("/readyz")
        assert (ready.status_code, ready.text) == (503, f"not ready: {NOT_LEADER}")
        synced = client.get("/readyz/synced")
        assert (synced.status_code, synced.text) == (200, "ok")
        leader = client.get("/readyz/leader")
        assert (leader.status_code, leader.text) == (503, f"not ready: {NOT_LEADER}")
        verbose = client.get("/readyz", params={"verbose": ""})
        assert verbose.status_code == 503
        assert verbose.text.splitlines() == [
            "[+]synced ok",
            f"[-]leader failed: {NOT_LEADER}",
            "readyz check failed",
        ]
        unknown = client.get("/readyz/etcd")
        assert unknown.status_code == 404
        assert "/readyz/synced, /readyz/leader" in unknown.text


def test_a_replica_that_leads_passes_every_check(serve: Serve) -> None:
    with serve().client() as client:
        assert client.get("/readyz/synced").text == "ok"
        assert client.get("/readyz/leader").text == "ok"
        assert client.get("/readyz?verbose").text.splitlines() == [
            "[+]synced ok",
            "[+]leader ok",
            "readyz check passed",
        ]


def test_every_verb_of_a_standby_answers_that_it_is_not_the_leader(serve: Serve) -> None:
    filter_args = orjson.dumps(fixture("filter_request_nodecache_true.json"))
    with serve(source=StandbySource()).client() as client:
        filtered = client.post("/filter", content=filter_args)
        assert (filtered.status_code, filtered.json()["Error"]) == (200, NOT_LEADER)
        for verb in ("prioritize", "preempt"):
            body = orjson.dumps(fixture(f"{verb}_request_nodecache_true.json"))
            answer = client.post(f"/{verb}", content=body)
            assert (answer.status_code, answer.json()) == (503, {"Error": NOT_LEADER})
        bound = client.post("/bind", content=orjson.dumps(fixture("bind_request.json")))
        assert (bound.status_code, bound.json()) == (200, {"Error": NOT_LEADER})
