"""The throughput benchmark's variants of phase A (loadtests/variants.py): what each name
means, the names refused, and the changes to a scheduler configuration."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loadtests.variants import SHORTLIST_ENV, VariantError, parse_variant, parse_variants

pytestmark = pytest.mark.unit

JSON = dict[str, Any]


def config(*, prioritize: bool = True, plugin_config: list[JSON] | None = None) -> JSON:
    """A scheduler configuration shaped like the shipped one (one profile, one extender)."""
    extender: JSON = {"urlPrefix": "http://127.0.0.1:8888", "filterVerb": "filter"}
    if prioritize:
        extender["prioritizeVerb"] = "prioritize"
    extender["bindVerb"] = "bind"
    profile: JSON = {"schedulerName": "default-scheduler"}
    if plugin_config is not None:
        profile["pluginConfig"] = plugin_config
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [profile],
        "extenders": [extender],
    }


PARSED = [
    pytest.param("full", "full", 0, False, id="full"),
    pytest.param("shortlist:8", "shortlist:8", 8, False, id="shortlist"),
    pytest.param("native", "native", None, True, id="native alone: shipped verbs"),
    pytest.param("shortlist:8+native", "shortlist:8+native", 8, True, id="combined"),
    pytest.param(" native + shortlist:1 ", "shortlist:1+native", 1, True, id="any order"),
    pytest.param("full+native", "full+native", 0, True, id="full and native"),
    pytest.param("native+filteronly", "filteronly+native", 0, True, id="filter only, native"),
]


@pytest.mark.parametrize(("text", "name", "shortlist", "native"), PARSED)
def test_a_variant_names_its_changes(
    text: str, name: str, shortlist: int | None, native: bool
) -> None:
    variant = parse_variant(text)
    assert (variant.name, variant.shortlist, variant.native) == (name, shortlist, native)
    expected_env = {SHORTLIST_ENV: str(shortlist)} if shortlist is not None else {}
    assert variant.env == expected_env


REFUSED = [
    pytest.param("fast", "unknown part 'fast'", id="unknown"),
    pytest.param("shortlist", "integer K >= 1", id="shortlist without K"),
    pytest.param("shortlist:0", "integer K >= 1", id="K zero"),
    pytest.param("shortlist:-3", "integer K >= 1", id="K negative"),
    pytest.param("shortlist:x", "integer K >= 1", id="K not a number"),
    pytest.param("full:3", "full takes no value", id="full with a value"),
    pytest.param("native:2", "unknown part", id="native with a value"),
    pytest.param("full+shortlist:4", "one of full, filteronly and", id="full and shortlist"),
    pytest.param("shortlist:4+shortlist:8", "one of full, filteronly", id="two shortlists"),
    pytest.param("filteronly+full", "one of full, filteronly", id="filter only and full"),
    pytest.param("filteronly:2", "filteronly takes no value", id="filter only with a value"),
    pytest.param("native+native", "native twice", id="native twice"),
    pytest.param("full+", "unknown part ''", id="empty part"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_a_bad_variant_is_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(VariantError, match=message):
        parse_variant(text)


def test_a_list_keeps_its_order_and_refuses_repeats_and_emptiness() -> None:
    names = [v.name for v in parse_variants("full, native,shortlist:8+native")]
    assert names == ["full", "native", "shortlist:8+native"]
    with pytest.raises(VariantError, match="given twice"):
        parse_variants("full,native,native+shortlist:2,native")
    with pytest.raises(VariantError, match="no variant"):
        parse_variants(" , ")


TRANSFORMS = [
    pytest.param("full", config(prioritize=False), True, id="full registers prioritize"),
    pytest.param("full", config(prioritize=True), True, id="full keeps prioritize"),
    pytest.param("shortlist:8", config(prioritize=True), False, id="shortlist drops it"),
    pytest.param("shortlist:8", config(prioritize=False), False, id="shortlist without it"),
    pytest.param("native", config(prioritize=True), True, id="native leaves the verbs"),
    pytest.param("native", config(prioritize=False), False, id="native leaves them absent"),
    pytest.param("filteronly", config(prioritize=True), False, id="filter only drops it"),
]


@pytest.mark.parametrize(("text", "before", "prioritize"), TRANSFORMS)
def test_the_verbs_follow_the_mode(text: str, before: JSON, prioritize: bool) -> None:
    untouched = copy.deepcopy(before)
    after = parse_variant(text).apply(before)
    assert before == untouched  # a copy is changed, never the caller's document
    extender = after["extenders"][0]
    assert ("prioritizeVerb" in extender) is prioritize
    if prioritize:
        assert extender["prioritizeVerb"] == "prioritize"
    assert extender["filterVerb"] == "filter"
    assert extender["bindVerb"] == "bind"


def _fit_args(document: JSON) -> JSON:
    (entry,) = [
        p for p in document["profiles"][0]["pluginConfig"] if p["name"] == "NodeResourcesFit"
    ]
    args: JSON = entry["args"]
    return args


MOST_ALLOCATED = {
    "type": "MostAllocated",
    "resources": [
        {"name": "cpu", "weight": 1},
        {"name": "memory", "weight": 1},
        {"name": "nvidia.com/gpu", "weight": 3},
    ],
}


@pytest.mark.parametrize(
    "plugin_config",
    [
        pytest.param(None, id="no pluginConfig"),
        pytest.param([{"name": "InterPodAffinity", "args": {"hardPodAffinityWeight": 2}}],
                     id="another plugin's config kept"),
        pytest.param([{"name": "NodeResourcesFit",
                       "args": {"ignoredResources": ["example.com/x"],
                                "scoringStrategy": {"type": "LeastAllocated"}}}],
                     id="NodeResourcesFit's other arguments kept"),
    ],
)  # fmt: skip
def test_native_packs_with_most_allocated(plugin_config: list[JSON] | None) -> None:
    before = config(plugin_config=copy.deepcopy(plugin_config))
    after = parse_variant("shortlist:4+native").apply(before)
    args = _fit_args(after)
    assert args["scoringStrategy"] == MOST_ALLOCATED
    others = [p for p in after["profiles"][0]["pluginConfig"] if p["name"] != "NodeResourcesFit"]
    assert others == [p for p in plugin_config or [] if p["name"] != "NodeResourcesFit"]
    if plugin_config and plugin_config[0]["name"] == "NodeResourcesFit":
        assert args["ignoredResources"] == ["example.com/x"]
    assert "prioritizeVerb" not in after["extenders"][0]


def test_a_mode_needs_exactly_one_extender_and_native_a_profile() -> None:
    no_extender = config()
    del no_extender["extenders"]
    with pytest.raises(VariantError, match="0 extenders"):
        parse_variant("full").apply(no_extender)
    no_profile = config()
    no_profile["profiles"] = []
    with pytest.raises(VariantError, match="no profile"):
        parse_variant("native").apply(no_profile)
