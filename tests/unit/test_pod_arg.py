import pytest

from app.plugin.pod_arg import pod_of


@pytest.mark.parametrize(
    ("argument", "namespace", "pod"),
    [("ml/trainer-0", None, ("ml", "trainer-0")), ("trainer-0", "ml", ("ml", "trainer-0")),
     ("ml/trainer-0", "ml", ("ml", "trainer-0"))],
)  # fmt: skip
def test_a_pod_is_namespace_slash_name_or_a_name_with_n(
    argument: str, namespace: str | None, pod: tuple[str, str]
) -> None:
    assert pod_of(argument, namespace) == pod


@pytest.mark.parametrize(
    ("argument", "namespace", "error"),
    [
        ("a/b/c", None, "'a/b' is not a namespace name"),
        ("trainer-0", None, "give the pod as NAMESPACE/NAME, or NAME with -n NAMESPACE"),
        ("ml/", None, "'' is not a pod name"),
        ("/x", None, "give the pod as NAMESPACE/NAME"),
        ("ml/Trainer", None, "'Trainer' is not a pod name"),
        ("ml/p", "other", "the pod ml/p is not in -n other"),
    ],
)
def test_anything_else_is_refused_saying_what_to_give(
    argument: str, namespace: str | None, error: str
) -> None:
    with pytest.raises(ValueError, match="^" + error.replace("(", r"\(").replace(")", r"\)")):
        pod_of(argument, namespace)
