"""YAML files a person wrote that must hold a mapping (schedext's settings file, a kubeconfig):
what is wrong with one is a single line naming the file, the line and the problem, instead of
a parser's traceback. Free of pydantic, for the kubectl plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlFileError", "read_yaml_mapping"]


class YamlFileError(ValueError):
    """One line: the file (and line), and what is wrong with it."""


def read_yaml_mapping(path: Path, noun: str, *, example: str) -> tuple[dict[str, Any], Any]:
    """The mapping a YAML file holds, and its node tree (for the line of each key; None for an
    empty file); YamlFileError when it is a directory, missing, unreadable, not UTF-8, no
    YAML, or no mapping. ``noun`` names the file's kind, ``example`` a key it would start
    with."""
    if path.is_dir():
        raise YamlFileError(f"{path}: is a directory, not a {noun}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise YamlFileError(f"{path}: {noun} not found") from None
    except OSError as error:
        raise YamlFileError(f"{path}: cannot read it: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise YamlFileError(
            f"{path} line {line}: not UTF-8 text (byte 0x{raw[error.start]:02x})"
        ) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        values = yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{path} line {mark.line + 1}" if mark is not None else str(path)
        problem = ": ".join(str(p) for p in (error.context, error.problem) if p)
        raise YamlFileError(f"{where}: not valid YAML ({problem})") from None
    except yaml.YAMLError as error:
        raise YamlFileError(f"{path}: not valid YAML ({error})") from None
    if values is None:
        return {}, None
    if not isinstance(values, dict):
        kind = "a list" if isinstance(values, list) else f"a {type(values).__name__}"
        raise YamlFileError(
            f"{path} line 1: a {noun} must be a mapping (such as {example}), not {kind}"
        )
    return values, node
