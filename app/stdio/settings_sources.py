"""Where each setting came from, and what is wrong with it, in words an operator reads.

``schedext serve`` and ``schedext agent`` read pydantic settings from up to four layers:
defaults, a YAML file, ``SCHEDEXT_...`` environment variables and command-line flags. This
module reads the file and the environment itself, instead of leaving it to pydantic-settings,
so that every value keeps its origin (``schedext.yaml line 3``, ``SCHEDEXT_POLICY__SHORTLIST``,
``--port``, the default), and so that what pydantic-settings would let through or turn into a
traceback is a one-line message instead:

* a file that is no YAML, not UTF-8, a directory, or a list rather than a mapping;
* an environment variable that is no JSON where a mapping or list is expected;
* a ``SCHEDEXT_*`` variable that names no setting (a typo in a group name), with the nearest
  valid name; :data:`OTHER_VARIABLES` are the ``SCHEDEXT_*`` variables that are not settings;
* a validation error, written as ``policy.shortlist: must be between 0 and 1000 (got -1, from
  SCHEDEXT_POLICY__SHORTLIST)`` rather than pydantic's text.

Shared by the service and the agent, which never import each other (see pyproject's
import-linter contracts)."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import annotated_types
import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from app.stdio.yaml_files import YamlFileError, read_yaml_mapping

__all__ = [
    "OTHER_VARIABLES",
    "Layers",
    "Origin",
    "SettingsError",
    "effective_yaml",
    "fingerprint",
    "load",
    "read_environment",
    "read_file",
    "variable_names",
]

# SCHEDEXT_* variables that are not settings of `schedext serve`: the node agent's own
# (SCHEDEXT_AGENT_*, checked by `schedext agent`), and those of the test and benchmark harness,
# which a development shell exports and every process it starts inherits.
OTHER_VARIABLES: dict[str, str] = {
    "SCHEDEXT_AGENT_*": "the node agent's settings (`schedext agent`, checked there)",
    "SCHEDEXT_K8S_BIN": "tests: the prebuilt control-plane binaries (docs/development.md)",
    "SCHEDEXT_TOOLS_BIN": "tests: the prebuilt helm and kustomize (docs/development.md)",
    "SCHEDEXT_CACHE_DIR": "tests: where those binaries are built and cached",
    "SCHEDEXT_E2E_KEEP_WORKDIR": "tests: keep the control plane's work directory",
    "SCHEDEXT_GOEXTENDER_BIN": "benchmarks: the Go extender the throughput floor compares with",
    "SCHEDEXT_SOAK_SEED": "tests: the seed of the soak test",
    "SCHEDEXT_GPU_REPORT": "tests: where the GPU tier writes what NVML read",
    "SCHEDEXT_DEVICE_CHECK_SIZE": "scripts/device-check: the size of its benchmarks",
    "SCHEDEXT_DEVICE_CHURN_SIZE": "scripts/device-check: the size of its churn benchmark",
    "SCHEDEXT_LOCUST_BIND_EVERY": "benchmarks: how often the locust load binds",
}

M = TypeVar("M", bound=BaseSettings)
Path_ = tuple[str, ...]


class SettingsError(ValueError):
    """Settings that cannot be used: one line per problem, each naming where it came from."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass(frozen=True)
class Origin:
    """Where a value came from: ``kind`` is default, file, env or flag."""

    kind: str
    where: str = ""
    # Whether the value was given whole (a scalar, a list, a group as JSON), so that it is
    # also the origin of the keys beneath it; a group written as a mapping of keys is not.
    whole: bool = True

    def __str__(self) -> str:
        return "the default" if self.kind == "default" else self.where


DEFAULT = Origin("default")


@dataclass
class Layers:
    """The values given, merged (file < environment < flags), and the origin of each."""

    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[Path_, Origin] = field(default_factory=dict)

    def add(self, values: Mapping[str, Any], origins: Mapping[Path_, Origin]) -> None:
        _deep_merge(self.values, values)
        # A layer that sets a key hides what lower layers said of the keys beneath it only
        # where it replaces them; keep the deepest origin that still holds.
        self.origins.update(origins)

    def origin(self, path: Path_) -> Origin:
        """The origin of ``path``, or of the nearest group above it that was given whole."""
        found = self.origins.get(path)
        if found is not None:
            return found
        for end in range(len(path) - 1, 0, -1):
            found = self.origins.get(path[:end])
            if found is not None and found.whole:
                return found
        return DEFAULT


def _deep_merge(into: dict[str, Any], values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


# --- the file -------------------------------------------------------------------------------


def read_file(path: Path) -> tuple[dict[str, Any], dict[Path_, Origin]]:
    """The settings of a YAML file, and the line of each key; SettingsError with one line
    when it cannot be read as a mapping of settings."""
    try:
        values, node = read_yaml_mapping(path, "settings file", example="`policy:`")
    except YamlFileError as error:
        raise SettingsError([str(error)]) from None
    origins: dict[Path_, Origin] = {}
    _key_lines(node, (), path, origins)
    return values, origins


def _key_lines(node: Any, at: Path_, path: Path, origins: dict[Path_, Origin]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for key, value in node.value:
        name = (*at, str(key.value))
        line = f"{path} line {key.start_mark.line + 1}"
        origins[name] = Origin("file", line, whole=not isinstance(value, yaml.MappingNode))
        _key_lines(value, name, path, origins)


# --- the environment ------------------------------------------------------------------------


def _complex(annotation: Any) -> bool:
    """Whether pydantic-settings reads this field's variable as JSON (a mapping, a list)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_complex(arg) for arg in typing.get_args(annotation) if arg is not type(None))
    if origin is typing.Annotated:
        return _complex(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return origin in (list, dict, tuple, set, frozenset) or annotation in (list, dict, tuple)


def _group(annotation: Any) -> type[BaseModel] | None:
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def variable_names(
    model: type[BaseModel], prefix: str, delimiter: str | None
) -> tuple[list[str], list[str]]:
    """The variables that name a setting or a group of ``model``, and the prefixes of those
    that name a key of a map setting (``SCHEDEXT_POLICY__WEIGHTS__<SCORER>``)."""
    names = _env_names(model, prefix, delimiter)
    maps = [
        (prefix + delimiter.join(path) + delimiter).upper()
        for path in _leaf_paths(model, ())
        if delimiter and typing.get_origin(_field(model, path).annotation) is dict
    ]
    return names, maps


def _env_names(model: type[BaseModel], prefix: str, delimiter: str | None) -> list[str]:
    """Every variable that names a setting or a group of ``model``."""
    names: list[str] = []
    for name, info in model.model_fields.items():
        names.append((prefix + name).upper())
        nested = _group(info.annotation)
        if nested is not None and delimiter:
            names += _env_names(nested, f"{prefix}{name}{delimiter}", delimiter)
    return names


def read_environment(
    model: type[BaseModel],
    environ: Mapping[str, str],
    *,
    prefix: str,
    delimiter: str | None,
    ignore: tuple[str, ...] = (),
) -> tuple[dict[str, Any], dict[Path_, Origin]]:
    """The settings of ``prefix`` variables, nested by ``delimiter``, as pydantic-settings reads
    them (case-insensitive, JSON for mappings and lists). A variable with the prefix that names
    no setting, and does not start with one of ``ignore`` (another command's, or one of
    :data:`OTHER_VARIABLES`), is a problem."""
    values: dict[str, Any] = {}
    origins: dict[Path_, Origin] = {}
    problems: list[str] = []
    known = _env_names(model, prefix, delimiter)
    others = [name.rstrip("*") for name in OTHER_VARIABLES]
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(prefix.upper()):
            continue
        if any(upper.startswith(other.upper()) for other in ignore) or upper in others:
            continue
        rest = variable[len(prefix) :].lower()
        parts = rest.split(delimiter) if delimiter else [rest]
        path = _setting_path(model, parts)
        if path is None:
            near = difflib.get_close_matches(upper, [*known, *others], n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]}?)" if near else ""
            problems.append(
                f"{variable}: names no setting{hint}; see docs/configuration.md for the "
                "variables schedext reads"
            )
            continue
        dotted, leaf = path
        raw = environ[variable]
        value: Any = raw
        if _complex(leaf):
            try:
                value = json.loads(raw)
            except ValueError as error:
                problems.append(
                    f"{variable}: {'.'.join(dotted)} takes JSON here "
                    f"({_json_example(leaf)}), got {_shown(raw)}: {error}"
                )
                continue
        nested: dict[str, Any] = values
        for part in dotted[:-1]:
            child = nested.setdefault(part, {})
            if not isinstance(child, dict):  # a group given whole as JSON, and one of its keys
                child = nested[part] = {}
            nested = child
        if isinstance(value, dict) and isinstance(nested.get(dotted[-1]), dict):
            _deep_merge(nested[dotted[-1]], value)
        else:
            nested[dotted[-1]] = value
        origins[dotted] = Origin("env", variable)
    if problems:
        raise SettingsError(problems)
    return values, origins


def _setting_path(model: type[BaseModel], parts: list[str]) -> tuple[Path_, Any] | None:
    """The dotted path and annotation a variable's parts name, or None."""
    current: type[BaseModel] | None = model
    path: list[str] = []
    for index, part in enumerate(parts):
        if current is None or part not in current.model_fields:
            return None
        annotation = current.model_fields[part].annotation
        path.append(part)
        if index == len(parts) - 1:
            return tuple(path), annotation
        if typing.get_origin(annotation) is dict:  # a map's key: SCHEDEXT_POLICY__WEIGHTS__X
            return (*path, *parts[index + 1 :]), str
        current = _group(annotation)
    return None


def _json_example(annotation: Any) -> str:
    if _group(annotation) is not None or typing.get_origin(annotation) is dict:
        return 'a mapping such as {"key": 1}'
    return 'a list such as ["a", "b"]'


# --- validation -----------------------------------------------------------------------------


@cache
def _from_values_only(model: type[M]) -> type[M]:
    """``model`` reading nothing but the values it is given: the layers are read here."""

    def sources(
        cls: type[BaseSettings],  # noqa: ARG001
        /,
        settings_cls: type[BaseSettings],  # noqa: ARG001
        init_settings: PydanticBaseSettingsSource,
        **others: PydanticBaseSettingsSource,  # noqa: ARG001
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)

    return type(model.__name__, (model,), {"settings_customise_sources": classmethod(sources)})


def load(model: type[M], layers: Layers, *, hints: Mapping[str, str] | None = None) -> M:
    """``model`` from ``layers``; SettingsError with one line per validation error.
    ``hints``: how to give a required key, by its dotted name."""
    try:
        loaded: M = _from_values_only(model)(**layers.values)
        return loaded
    except ValidationError as error:
        raise SettingsError(describe(error, model, layers, hints=hints)) from None


def describe(
    error: ValidationError,
    model: type[BaseModel],
    layers: Layers,
    *,
    hints: Mapping[str, str] | None = None,
) -> list[str]:
    """Each of pydantic's errors as ``key: rule (got value, from origin)``."""
    lines = []
    for item in error.errors(include_url=False):
        loc = tuple(str(part) for part in item["loc"])
        cause = (item.get("ctx") or {}).get("error")
        info = _field(model, loc)
        group = info is None or _group(info.annotation) is not None
        if item["type"] == "value_error" and isinstance(cause, Exception) and group:
            lines.append(_rule_line(model, loc, str(cause), layers))
            continue
        key = ".".join(loc) or "the settings"
        rule = _rule(item, model, loc)
        origin = layers.origin(loc)
        if item["type"] == "missing" and key in (hints or {}):
            lines.append(f"{key}: {rule}: give it with {(hints or {})[key]}")
        elif item["type"] in ("extra_forbidden", "missing"):
            where = "" if origin is DEFAULT else f" (from {origin})"
            lines.append(f"{key}: {rule}{where}")
        else:
            lines.append(f"{key}: {rule} (got {_shown(item.get('input'))}, from {origin})")
    return lines


def _rule_line(model: type[BaseModel], loc: Path_, message: str, layers: Layers) -> str:
    """A rule a validator checks: the keys its message names, each with value and origin."""
    # The keys it names in full (bind.api_deadline_s), or by their name within the group
    # whose rule it is (gpu_resource, in a rule of policy's).
    named_as: dict[str, str] = {}
    for path in _leaf_paths(model, ()):
        for said in (".".join(path), ".".join(path[len(loc) :]) if path[: len(loc)] == loc else ""):
            if said and said not in named_as.values():
                found = re.search(rf"(?<![\w.]){re.escape(said)}(?![\w])", message)
                if found is not None:
                    named_as[".".join(path)] = said
                    break
    named = sorted(named_as, key=lambda key: message.index(named_as[key]))
    if not named:
        return f"{'.'.join(loc) or 'settings'}: {message}"
    said = "; ".join(
        f"{key} = {_shown(_value_at(layers.values, model, tuple(key.split('.'))))} "
        f"from {layers.origin(tuple(key.split('.')))}"
        for key in named
    )
    return f"{', '.join(named)}: {message} ({said})"


def _leaf_paths(model: type[BaseModel], at: Path_) -> Iterator[Path_]:
    for name, info in model.model_fields.items():
        nested = _group(info.annotation)
        if nested is None:
            yield (*at, name)
        else:
            yield from _leaf_paths(nested, (*at, name))


def _value_at(values: Mapping[str, Any], model: type[BaseModel], path: Path_) -> Any:
    current: Any = values
    for part in path:
        if not isinstance(current, Mapping) or part not in current:
            return _field_default(model, path)
        current = current[part]
    return current


def _field_default(model: type[BaseModel], path: Path_) -> Any:
    info = _field(model, path)
    if info is None or info.is_required():
        return None
    return info.get_default(call_default_factory=True)


def _field(model: type[BaseModel], path: Path_) -> Any:
    current: type[BaseModel] | None = model
    info = None
    for part in path:
        if current is None or part not in current.model_fields:
            return None
        info = current.model_fields[part]
        current = _group(info.annotation)
    return info


def _bounds(model: type[BaseModel], loc: Path_) -> dict[str, Any]:
    info = _field(model, loc)
    found: dict[str, Any] = {}
    for meta in getattr(info, "metadata", ()):
        for name in ("ge", "gt", "le", "lt"):
            if isinstance(meta, getattr(annotated_types, name.capitalize())):
                found[name] = getattr(meta, name)
    return found


def _n(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _rule(item: Any, model: type[BaseModel], loc: Path_) -> str:  # noqa: PLR0911 (by kind)
    """The rule a value broke, in plain words."""
    kind, ctx = item["type"], item.get("ctx") or {}
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bounds = _bounds(model, loc)
        low = ("at least", bounds["ge"]) if "ge" in bounds else None
        low = ("more than", bounds["gt"]) if "gt" in bounds else low
        high = ("at most", bounds["le"]) if "le" in bounds else None
        high = ("less than", bounds["lt"]) if "lt" in bounds else high
        if low and high and "ge" in bounds and "le" in bounds:
            return f"must be between {_n(bounds['ge'])} and {_n(bounds['le'])}"
        parts = [f"{said[0]} {_n(said[1])}" for said in (low, high) if said is not None]
        if not parts:  # a bound pydantic checked that the field does not carry
            return str(item["msg"]).removeprefix("Input should be ").join(("must be ", ""))
        return "must be " + " and ".join(parts)
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    if kind == "extra_forbidden":
        parent = _field(model, loc[:-1]) if len(loc) > 1 else None
        group = _group(parent.annotation) if parent is not None else model
        siblings = list(group.model_fields) if group is not None else []
        near = difflib.get_close_matches(loc[-1], siblings, n=1, cutoff=0.6)
        where = ".".join(loc[:-1]) or "the top level"
        if near:
            return f"is not a setting (did you mean {'.'.join((*loc[:-1], near[0]))}?)"
        return f"is not a setting ({where} has: {', '.join(siblings)})"
    if kind == "missing":
        return "is required"
    cause = ctx.get("error")
    if kind == "value_error" and isinstance(cause, Exception):
        return str(cause)
    words = {
        "int_parsing": "must be a whole number",
        "int_type": "must be a whole number",
        "int_from_float": "must be a whole number",
        "float_parsing": "must be a number",
        "float_type": "must be a number",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "path_type": "must be a path",
        "dict_type": "must be a mapping",
        "list_type": "must be a list",
        "model_type": "must be a mapping of settings",
        "model_attributes_type": "must be a mapping of settings",
        "string_too_short": "must not be empty",
    }
    if kind in words:
        return words[kind]
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} item(s)"
    return str(item["msg"]).removeprefix("Value error, ").removeprefix("Input ")


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return _n(value)
    if isinstance(value, str):
        return value if value.strip() else json.dumps(value)
    if isinstance(value, Path):
        return str(value)
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- showing the result ---------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, BaseModel):
        return {k: _plain(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _flow(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000, sort_keys=False)
    return text.strip().removesuffix("...").strip()


def effective_yaml(settings: BaseModel, layers: Layers) -> str:
    """The settings as a YAML file, each key followed by its origin as a comment; at the top
    level the groups first, as docs/configuration.md writes the whole file."""
    lines: list[str] = []

    def walk(model: BaseModel, at: Path_, indent: str) -> None:
        names = list(type(model).model_fields)
        if not at:
            names.sort(key=lambda n: not isinstance(getattr(model, n), BaseModel))
        for name in names:
            value = getattr(model, name)
            path = (*at, name)
            if isinstance(value, BaseModel):
                lines.append(f"{indent}{name}:")
                walk(value, path, indent + "  ")
                continue
            origin = layers.origin(path)
            label = "default" if origin is DEFAULT else f"{origin.kind} {origin.where}"
            lines.append(f"{indent}{name}: {_flow(_plain(value))}  # {label}")

    walk(settings, (), "")
    return "\n".join(lines) + "\n"


def fingerprint(
    settings: BaseModel, defaults: BaseModel, layers: Layers, *, redacted: frozenset[str]
) -> dict[str, Any]:
    """What `serve` logs at start: a hash of the effective settings, and the keys that differ
    from their defaults with their values (``redacted`` keys hidden) and origins."""
    effective = _plain(settings)
    digest = hashlib.sha256(json.dumps(effective, sort_keys=True).encode()).hexdigest()[:16]
    changed: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for path in _leaf_paths(type(settings), ()):
        value, default = _plain(_get(settings, path)), _plain(_get(defaults, path))
        if value != default:
            key = ".".join(path)
            changed[key] = "<redacted>" if key in redacted else value
            origins[key] = str(layers.origin(path))
    return {"config_hash": digest, "non_default": changed, "non_default_from": origins}


def _get(model: BaseModel, path: Path_) -> Any:
    value: Any = model
    for part in path:
        value = getattr(value, part)
    return value
