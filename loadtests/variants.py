"""Variants of the throughput benchmark's phase A: the scheduler configuration and schedext's
settings that each measures (``loadtests.throughput --variants``).

A variant is a change to the shipped ``manifests/scheduler-config.yaml`` (as a parsed
document) plus environment for schedext. Named parts, combined with ``+``:

- ``full``: the extender registers ``prioritizeVerb: prioritize`` and schedext runs with
  ``SCHEDEXT_POLICY__SHORTLIST=0``: filter answers every feasible node, prioritize scores them;
- ``shortlist:K`` (K >= 1): no ``prioritizeVerb``, and ``SCHEDEXT_POLICY__SHORTLIST=K``: filter
  answers only the K best feasible nodes by schedext's own scorers;
- ``filteronly``: no ``prioritizeVerb``, and ``SCHEDEXT_POLICY__SHORTLIST=0``: filter answers
  every feasible node and kube-scheduler's own plugins alone choose among them (with
  ``native``: kube-scheduler packs, schedext keeps only its filter and bind decisions);
- ``native``: the profile's ``NodeResourcesFit`` scores with ``MostAllocated`` on CPU, memory
  and GPUs (GPUs weighted 3), so that kube-scheduler packs GPUs itself.

``full``, ``filteronly`` and ``shortlist`` exclude each other; ``shortlist:8+native`` is one
variant.
Everything here is pure: no I/O, so the unit tier checks the parsing and the transforms.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
SHORTLIST_ENV = "SCHEDEXT_POLICY__SHORTLIST"
PRIORITIZE_VERB = "prioritize"
GPU = "nvidia.com/gpu"
# kube-scheduler's own bin-packing: the GPU weighted above CPU and memory, so that a node's
# GPUs fill before the next node's are touched.
MOST_ALLOCATED: JSON = {
    "type": "MostAllocated",
    "resources": [
        {"name": "cpu", "weight": 1},
        {"name": "memory", "weight": 1},
        {"name": GPU, "weight": 3},
    ],
}
PARTS = ("full", "filteronly", "shortlist:K", "native")


class VariantError(ValueError):
    """A variant that cannot be parsed or applied; the message says which and why."""


@dataclass(frozen=True)
class Variant:
    """One variant: ``shortlist`` None leaves the extender's verbs and schedext's setting as
    shipped, 0 is full mode (prioritize registered), K >= 1 the shortlist of K (no
    prioritize); ``native`` adds kube-scheduler's MostAllocated scoring."""

    name: str
    shortlist: int | None = None
    native: bool = False
    filter_only: bool = False  # shortlist 0 without prioritize: kube-scheduler scores alone
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """What the variant changes, in words (the legend of the benchmark's tables)."""
        parts = []
        if self.filter_only:
            parts.append(f"no prioritizeVerb, {SHORTLIST_ENV}=0 (every feasible node, unscored)")
        elif self.shortlist == 0:
            parts.append(f"prioritizeVerb registered, {SHORTLIST_ENV}=0 (full mode)")
        elif self.shortlist is not None:
            parts.append(f"no prioritizeVerb, {SHORTLIST_ENV}={self.shortlist}")
        if self.native:
            parts.append("NodeResourcesFit MostAllocated (cpu 1, memory 1, nvidia.com/gpu 3)")
        return "; ".join(parts)

    def apply(self, config: JSON) -> JSON:
        """A copy of the parsed scheduler configuration with this variant's changes."""
        changed = copy.deepcopy(config)
        if self.shortlist is not None:
            extenders = changed.get("extenders") or []
            if len(extenders) != 1:
                raise VariantError(
                    f"variant {self.name}: the configuration has {len(extenders)} extenders, "
                    "expected exactly one (schedext)"
                )
            if self.shortlist == 0 and not self.filter_only:
                extenders[0]["prioritizeVerb"] = PRIORITIZE_VERB
            else:
                extenders[0].pop("prioritizeVerb", None)
        if self.native:
            profiles = changed.get("profiles") or []
            if not profiles:
                raise VariantError(f"variant {self.name}: the configuration has no profile")
            for profile in profiles:
                _score_most_allocated(profile)
        return changed


def _score_most_allocated(profile: JSON) -> None:
    """NodeResourcesFit's scoringStrategy set to MostAllocated, its other arguments kept."""
    plugins = profile.setdefault("pluginConfig", [])
    entry = next((p for p in plugins if p.get("name") == "NodeResourcesFit"), None)
    if entry is None:
        entry = {"name": "NodeResourcesFit", "args": {}}
        plugins.append(entry)
    args = entry.setdefault("args", {})
    args["scoringStrategy"] = copy.deepcopy(MOST_ALLOCATED)


def parse_variant(text: str) -> Variant:
    """``full``, ``shortlist:K``, ``native``, or several joined by ``+``."""
    name = text.strip()
    shortlist: int | None = None
    native = False
    filter_only = False
    for raw in name.split("+"):
        part = raw.strip()
        kind, _, value = part.partition(":")
        if kind == "native" and not value:
            if native:
                raise VariantError(f"variant {name!r}: native twice")
            native = True
        elif kind in ("full", "filteronly", "shortlist"):
            if shortlist is not None:
                raise VariantError(
                    f"variant {name!r}: choose one of full, filteronly and shortlist:K, once"
                )
            filter_only = kind == "filteronly"
            plain = kind in ("full", "filteronly") and not value
            shortlist = 0 if plain else _shortlist_size(name, kind, value)
        else:
            raise VariantError(
                f"variant {name!r}: unknown part {part!r}; parts are {', '.join(PARTS)}, "
                "joined by +"
            )
    env = {SHORTLIST_ENV: str(shortlist)} if shortlist is not None else {}
    canonical = "+".join(
        [*(["filteronly"] if filter_only else ["full"] if shortlist == 0 else []),
         *([f"shortlist:{shortlist}"] if shortlist else []),
         *(["native"] if native else [])]
    )  # fmt: skip
    return Variant(canonical, shortlist=shortlist, native=native, env=env, filter_only=filter_only)


def _shortlist_size(name: str, kind: str, value: str) -> int:
    if kind in ("full", "filteronly"):
        raise VariantError(f"variant {name!r}: {kind} takes no value")
    if not value.isdigit() or int(value) < 1:
        raise VariantError(f"variant {name!r}: shortlist:K needs an integer K >= 1")
    return int(value)


def parse_variants(text: str) -> list[Variant]:
    """A comma-separated list of variants, each once (in the order given)."""
    variants = [parse_variant(item) for item in text.split(",") if item.strip()]
    if not variants:
        raise VariantError(f"no variant in {text!r}; parts are {', '.join(PARTS)}, joined by +")
    names = [v.name for v in variants]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise VariantError(f"variant {', '.join(twice)} given twice")
    return variants
