"""ElasticQuotas decoded or refused, the quota book (two quotas in one namespace), and the
intake's doors for them."""

from __future__ import annotations

from typing import Any

import pytest

from extender import names
from extender.config import SHARE_PRESETS, ShareResources
from extender.quotas import Kind, Limit, QuotaBook, QuotaError, quota_spec, used_quantities
from extender.scheduler import Scheduler
from extender.tally import Amounts
from testbed.builders import elastic_quota

GPU = names.GPU_RESOURCE
MEM = names.SHARE_MEMORY_RESOURCE
CORES = names.SHARE_CORES_RESOURCE


def decode(obj: dict[str, Any], shares: ShareResources | None = None) -> tuple[Limit, ...]:
    spec = quota_spec(obj, gpu_resource=GPU, shares=shares or ShareResources())
    assert spec is not None
    return spec.limits


GOOD = [
    # (id, min, max, limits)
    ("GPUs: min and max", {GPU: "4"}, {GPU: 8},
     (Limit(Kind.GPUS, GPU, 4, 8),)),
    ("no max: no ceiling", {GPU: "4"}, None,
     (Limit(Kind.GPUS, GPU, 4, None),)),
    ("no min: 0, and a plain ceiling", None, {GPU: "2"},
     (Limit(Kind.GPUS, GPU, 0, 2, guarantees=False),)),
    ("a min of 0 stated: it borrows", {GPU: "0"}, {GPU: "2"},
     (Limit(Kind.GPUS, GPU, 0, 2),)),
    ("CPU in milli, memory in bytes", {"cpu": "1500m", "memory": "1Gi"}, {"cpu": 4},
     (Limit(Kind.CPU, "cpu", 1500, 4000), Limit(Kind.MEMORY, "memory", 2**30, None))),
    ("a max for one resource, a min for another", {"cpu": "1"}, {GPU: 8},
     (Limit(Kind.GPUS, GPU, 0, 8, guarantees=False), Limit(Kind.CPU, "cpu", 1000, None))),
    ("GPU shares: MiB and percent", {MEM: "40960", CORES: "150"}, {MEM: "81920"},
     (Limit(Kind.SHARE_MEMORY, MEM, 40960, 81920), Limit(Kind.SHARE_CORES, CORES, 150, None))),
    ("a fraction rounds up, as Kubernetes' Value()", {GPU: "1.5"}, None,
     (Limit(Kind.GPUS, GPU, 2, None),)),
    ("an empty spec names nothing", None, None, ()),
]  # fmt: skip


@pytest.mark.parametrize(("low", "high", "limits"), [c[1:] for c in GOOD], ids=[c[0] for c in GOOD])
def test_a_quota_decodes_into_limits_in_the_cores_units(
    low: dict[str, Any] | None, high: dict[str, Any] | None, limits: tuple[Limit, ...]
) -> None:
    assert decode(elastic_quota("team-a", min=low, max=high)) == limits


def test_gpushare_memory_is_counted_in_mib_and_shown_in_its_own_unit() -> None:
    gpushare = SHARE_PRESETS["gpushare"]
    obj = elastic_quota("team-a", min={"aliyun.com/gpu-mem": "16"})
    spec = quota_spec(obj, gpu_resource=GPU, shares=gpushare)
    assert spec is not None
    assert spec.limits == (Limit(Kind.SHARE_MEMORY, "aliyun.com/gpu-mem", 16 * 1024, None),)
    used = Amounts(share_memory_mib=8 * 1024)
    assert used_quantities(spec, used) == {"aliyun.com/gpu-mem": "8"}


BAD = [
    # (id, quota, what the message says)
    ("min over max", elastic_quota("team-a", min={GPU: 8}, max={GPU: 4}),
     "ElasticQuota team-a/team-a: min 8 is over max 4 for nvidia.com/gpu"),
    ("a negative quantity", elastic_quota("team-a", max={"cpu": "-1"}),
     "ElasticQuota team-a/team-a: spec.max.cpu is negative: -1"),
    ("a resource schedext does not count", elastic_quota("team-a", min={"pods": "10"}),
     "ElasticQuota team-a/team-a: spec.min names pods, which schedext does not count (it counts "
     "nvidia.com/gpu, schedext.io/gpu-memory, schedext.io/gpu-cores, cpu, memory)"),
    ("MIG devices are not counted", elastic_quota("team-a", max={"nvidia.com/mig-1g.10gb": 2}),
     "spec.max names nvidia.com/mig-1g.10gb, which schedext does not count"),
    ("not a quantity", elastic_quota("team-a", max={GPU: "eight"}),
     "ElasticQuota team-a/team-a: spec.max.nvidia.com/gpu is not a quantity: 'eight'"),
    ("a boolean is no quantity", elastic_quota("team-a", max={GPU: True}),  # type: ignore[dict-item]
     "spec.max.nvidia.com/gpu is not a quantity: True"),
    ("a borrow weight that is no whole number", elastic_quota("team-a", weight="1.5"),
     "annotation schedext.io/borrow-weight must be a whole number >= 0, not '1.5'"),
    # Python's int() refuses more than 4300 digits with a ValueError of its own
    ("a quantity of 5000 digits", elastic_quota("team-a", max={GPU: "1" * 5000}),
     "spec.max.nvidia.com/gpu is not a quantity: '1111111111111111111111111111111111111111...' "
     "(5000 characters)"),
    ("a quantity over 2^63-1", elastic_quota("team-a", max={"memory": "16Ei"}),
     "spec.max.memory is out of range (over 2^63-1): '16Ei'"),
    ("a borrow weight of 5000 digits", elastic_quota("team-a", weight="1" * 5000),
     "annotation schedext.io/borrow-weight must be a whole number >= 0, not '1111111111"),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_quota_that_cannot_apply_is_refused_with_why(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(QuotaError) as refused:
        decode(obj)
    assert message in str(refused.value)


def test_a_spec_min_that_is_no_resource_list_is_refused() -> None:
    obj = elastic_quota("team-a")
    obj["spec"]["min"] = ["nvidia.com/gpu"]
    with pytest.raises(QuotaError, match=r"spec\.min is not a resource list"):
        decode(obj)


def test_a_quota_without_a_name_is_no_quota() -> None:
    obj = elastic_quota("team-a")
    del obj["metadata"]["name"]
    assert quota_spec(obj, gpu_resource=GPU, shares=ShareResources()) is None


def test_the_borrow_weight_annotation_overrides_the_min() -> None:
    spec = quota_spec(
        elastic_quota("team-a", min={GPU: 4, "cpu": 8}, weight="3"),
        gpu_resource=GPU,
        shares=ShareResources(),
    )
    assert spec is not None
    assert [spec.weight(limit) for limit in spec.limits] == [3, 3]
    plain = quota_spec(
        elastic_quota("team-a", min={GPU: 4, "cpu": 8}), gpu_resource=GPU, shares=ShareResources()
    )
    assert plain is not None
    assert [plain.weight(limit) for limit in plain.limits] == [4, 8000]


# ------------------------------------------------------------------ two in a namespace

OLD, NEW = "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"


def spec_of(obj: dict[str, Any]) -> Any:
    return quota_spec(obj, gpu_resource=GPU, shares=ShareResources())


def test_of_two_quotas_in_a_namespace_the_oldest_applies_and_the_other_is_shadowed() -> None:
    book = QuotaBook()
    newer = spec_of(elastic_quota("team-a", name="later", max={GPU: 2}, created=NEW))
    older = spec_of(elastic_quota("team-a", name="first", max={GPU: 8}, created=OLD))
    book.upsert(newer)
    assert book.applying("team-a") == newer
    book.upsert(older)  # an older one arriving later (a relist order) still wins
    assert book.applying("team-a") == older
    assert [(s.quota.name, s.by.name) for s in book.shadowed()] == [("later", "first")]
    book.delete("team-a", "first")
    assert book.applying("team-a") == newer
    assert book.shadowed() == []
    book.delete("team-a", "later")
    assert book.applying("team-a") is None
    assert len(book) == 0


def test_two_quotas_of_the_same_age_are_ordered_by_name() -> None:
    book = QuotaBook()
    book.replace([spec_of(elastic_quota("team-a", name=n, created=OLD)) for n in ("b", "a")])
    applying = book.applying("team-a")
    assert applying is not None
    assert applying.name == "a"


# ---------------------------------------------------------------------- the intake


def test_the_intake_upserts_deletes_and_relists_quotas() -> None:
    scheduler = Scheduler()
    scheduler.upsert_quota(elastic_quota("team-a", max={GPU: 8}))
    assert [q.key for q in scheduler.quotas()] == ["team-a/team-a"]
    scheduler.delete_quota(elastic_quota("team-a"))
    assert scheduler.quotas() == []
    refused = scheduler.replace_quotas(
        [elastic_quota("team-a", max={GPU: 8}), elastic_quota("team-b", min={GPU: 9}, max={GPU: 1})]
    )
    assert [q.key for q in scheduler.quotas()] == ["team-a/team-a"]
    assert [str(e) for e in refused] == [
        "ElasticQuota team-b/team-b: min 9 is over max 1 for nvidia.com/gpu"
    ]


def test_a_quota_edited_into_one_that_cannot_apply_stops_applying() -> None:
    scheduler = Scheduler()
    scheduler.upsert_quota(elastic_quota("team-a", max={GPU: 8}))
    with pytest.raises(QuotaError):
        scheduler.upsert_quota(elastic_quota("team-a", max={GPU: -8}))
    assert scheduler.quotas() == []  # as after a restart, where it would never be read


def test_shadowed_quotas_are_reported_by_the_scheduler() -> None:
    scheduler = Scheduler()
    scheduler.upsert_quota(elastic_quota("team-a", name="x", created=NEW))
    scheduler.upsert_quota(elastic_quota("team-a", name="y", created=OLD))
    assert [(s.quota.key, s.by.key) for s in scheduler.shadowed_quotas()] == [
        ("team-a/x", "team-a/y")
    ]
