"""Every ``SCHEDEXT_*`` environment variable the repository reads is a setting of `schedext
serve`, one of the node agent's, or on the list of those that are not settings
(``OTHER_VARIABLES``, documented in docs/configuration.md): `schedext serve` refuses a
``SCHEDEXT_*`` variable that names no setting, so a harness variable missing from the list
would stop every schedext a shell that exports it starts."""

from __future__ import annotations

import re
from pathlib import Path

from app.agent.settings import PREFIX as AGENT_PREFIX
from app.agent.settings import AgentSettings
from app.service.settings import Settings
from app.stdio.settings_sources import OTHER_VARIABLES, variable_names

ROOT = Path(__file__).resolve().parents[2]
# A variable as code reads or sets it: os.environ[...], .get(...), getenv, setenv, a constant
# named *_ENV, in Python; ${NAME} or $NAME in shell.
READ = re.compile(
    r"""(?:environ(?:\.get\(|\[)|getenv\(|setenv\(|_ENV\s*=\s*)["'](SCHEDEXT_[A-Z0-9_]*[A-Z0-9])["']"""
    r"|\$\{?(SCHEDEXT_[A-Z0-9_]*[A-Z0-9])"
)


def read_variables() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in ("app", "testbed", "tests", "loadtests", "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if not path.is_file() or path.suffix not in ("", ".py", ".sh"):
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            for match in READ.finditer(text):
                found.setdefault(match.group(1) or match.group(2), path)
    return found


def test_every_schedext_variable_read_is_a_setting_or_listed() -> None:
    config = Settings.model_config
    serve, maps = variable_names(Settings, config["env_prefix"], config["env_nested_delimiter"])
    agent, _ = variable_names(AgentSettings, AGENT_PREFIX, None)
    known = {*serve, *agent, *OTHER_VARIABLES}
    found = read_variables()
    assert "SCHEDEXT_K8S_BIN" in found  # the pattern finds what the harness reads
    unknown = {
        name: str(path.relative_to(ROOT))
        for name, path in found.items()
        if name not in known
        and not name.startswith((*maps, AGENT_PREFIX))
        and path.name != Path(__file__).name
    }
    assert not unknown, f"read but neither a setting nor in OTHER_VARIABLES: {unknown}"
