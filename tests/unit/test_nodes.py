import json

import pytest

from extender import names
from extender.nodes import node_spec, parse_topology
from testbed.builders import A100, H100, make_node


def test_node_spec_reads_allocatable_and_gpu_labels() -> None:
    spec = node_spec(
        make_node(
            "g1",
            gpus=8,
            model=H100,
            groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
            cpu="47810m",
            memory="194633128Ki",
        )
    )
    assert spec.name == "g1"
    assert (spec.cpu_milli, spec.memory_bytes) == (47810, 194633128 * 1024)
    assert (spec.gpu_count, spec.gpu_model, spec.gpu_memory_mib) == (8, H100, 81559)
    assert spec.gpu_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert spec.topology_problem is None


def test_node_without_gpus() -> None:
    spec = node_spec(make_node("cpu-1"))
    assert (spec.gpu_count, spec.gpu_model, spec.gpu_groups) == (0, None, ())


def test_capacity_is_used_when_allocatable_is_missing() -> None:
    node = make_node("g", gpus=4, model=A100)
    del node["status"]["allocatable"]
    assert node_spec(node).gpu_count == 4


def test_unreadable_quantities_count_as_absent() -> None:
    node = make_node("g", gpus=4)
    node["status"]["allocatable"]["cpu"] = "lots"
    node["status"]["allocatable"]["nvidia.com/gpu"] = {"bad": 1}
    spec = node_spec(node)
    assert (spec.cpu_milli, spec.gpu_count) == (0, 0)


# Values the inventory cannot count: Python's int() refuses more than 4300 digits, reads
# "\u00b2" as a digit to isdigit() and not to int(), and the inventory's columns are int64.
UNCOUNTABLE = [
    ("gpus of 5000 digits", {"nvidia.com/gpu": "1" * 5000}, {"gpu_count": 0}),
    ("more GPUs than any node has", {"nvidia.com/gpu": "100000"}, {"gpu_count": 0}),
    ("cpu over 2^63-1", {"cpu": "1e30"}, {"cpu_milli": 0}),
    ("cpu within 2^63-1, not in milli-CPU", {"cpu": "9223372036854775807"}, {"cpu_milli": 0}),
    ("memory of 5000 digits", {"memory": "1" * 5000}, {"memory_bytes": 0}),
]


@pytest.mark.parametrize(
    ("allocatable", "expected"),
    [(a, e) for _, a, e in UNCOUNTABLE],
    ids=[n for n, _, _ in UNCOUNTABLE],
)
def test_quantities_the_inventory_cannot_count_count_as_absent(
    allocatable: dict[str, str], expected: dict[str, int]
) -> None:
    node = make_node("g", gpus=4)
    node["status"]["allocatable"].update(allocatable)
    spec = node_spec(node)
    assert {field: getattr(spec, field) for field in expected} == expected


@pytest.mark.parametrize(
    "label", ["\u00b2", "4" * 5000, "40960MiB"], ids=["superscript", "5000 digits", "unit"]
)
def test_an_unreadable_gpu_memory_label_counts_as_absent(label: str) -> None:
    node = make_node("g", gpus=4, labels={names.GPU_MEMORY_LABEL: label})
    assert node_spec(node).gpu_memory_mib is None


TOPOLOGY_CASES = [
    ("absent", None, 8, (), None),
    (
        "two nvlink groups",
        {"groups": [[0, 1, 2, 3], [4, 5, 6, 7]]},
        8,
        ((0, 1, 2, 3), (4, 5, 6, 7)),
        None,
    ),
    ("unsorted members are sorted", {"groups": [[3, 1], [0, 2]]}, 4, ((1, 3), (0, 2)), None),
    ("partial cover is allowed", {"groups": [[0, 1]]}, 4, ((0, 1),), None),
    ("not json", "{oops", 4, (), "not JSON"),
    ("wrong shape", {"gpus": [0, 1]}, 4, (), "expected"),
    ("empty group", {"groups": [[]]}, 4, (), "expected"),
    ("index out of range", {"groups": [[0, 4]]}, 4, (), "outside 0..3"),
    ("gpu twice", {"groups": [[0, 1], [1, 2]]}, 4, (), "listed twice"),
    ("non-integer index", {"groups": [[0, "1"]]}, 4, (), "integers"),
    ("boolean index", {"groups": [[True]]}, 4, (), "integers"),
]


@pytest.mark.parametrize(
    ("raw", "gpus", "groups", "problem"),
    [c[1:] for c in TOPOLOGY_CASES],
    ids=[c[0] for c in TOPOLOGY_CASES],
)
def test_topology_annotation(
    raw: object, gpus: int, groups: tuple[tuple[int, ...], ...], problem: str | None
) -> None:
    text = raw if raw is None or isinstance(raw, str) else json.dumps(raw)
    parsed, why = parse_topology(text, gpus)
    assert parsed == groups
    if problem is None:
        assert why is None
    else:
        assert why is not None
        assert problem in why
        assert why.startswith(names.GPU_TOPOLOGY)


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("gpu-node-1", True),
        ("node.rack-2.example.com", True),
        ("a", True),
        ('evil"node', False),
        ("Upper", False),
        ("-leading-dash", False),
        ("x" * 254, False),
    ],
)
def test_only_valid_kubernetes_node_names_are_kept(name: str, kept: bool) -> None:
    node = make_node("placeholder")
    node["metadata"]["name"] = name
    assert node_spec(node).name == (name if kept else "")
