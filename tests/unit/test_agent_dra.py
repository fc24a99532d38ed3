"""The node agent on DRA nodes: whether its device plugins serve (``device_plugin`` on, off,
or auto: not while a GPU DRA driver is registered with the kubelet), what it reads of the
kubelet's plugin registry to say so, the grace a departed driver gets, the settings, and what
the probes show."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError

from app.agent.dra_drivers import (
    Decision,
    DevicePluginMode,
    RegisteredDriver,
    device_plugin_wanted,
    registered_drivers,
)
from app.agent.plugin_switch import PluginSwitch
from app.agent.probes import AgentState, metrics_registry
from app.agent.settings import AgentSettings

pytestmark = pytest.mark.unit

NVIDIA = "gpu.nvidia.com"
REGISTRY = Path("/var/lib/kubelet/plugins_registry")


# --- builders ---------------------------------------------------------------------------------


def found(*drivers: str) -> tuple[RegisteredDriver, ...]:
    """Drivers registered as the kubeletplugin library names their sockets."""
    return tuple(RegisteredDriver(d, REGISTRY / f"{d}-reg.sock") for d in drivers)


@pytest.fixture
def registry() -> Iterator[Path]:
    # Short: a unix socket's path must fit in 108 bytes, which pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="reg-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def a_socket(path: Path) -> Path:
    """A unix socket file at ``path``, as a kubelet plugin leaves it (bound; nobody needs to
    listen for the agent to see it)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.close()
    return path


def settings(**values: Any) -> AgentSettings:
    return AgentSettings(node_name="n1", **values)


# --- the decision -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    mode: DevicePluginMode
    found: tuple[RegisteredDriver, ...] | None
    register: bool
    why: str


CASES = [
    Case("on, no driver", "on", None, True, "device_plugin is set to on"),
    Case("on wins over a driver", "on", found(NVIDIA), True, "device_plugin is set to on"),
    Case("off, no driver", "off", None, False, "device_plugin is set to off"),
    Case("off with a driver", "off", found(NVIDIA), False, "device_plugin is set to off"),
    Case(
        "auto, the driver registered",
        "auto",
        found(NVIDIA),
        False,
        "DRA driver gpu.nvidia.com is registered with the kubelet "
        "(plugins_registry/gpu.nvidia.com-reg.sock)",
    ),
    Case(
        "auto, two drivers: the first named",
        "auto",
        found("gpu.example.com", NVIDIA),
        False,
        "DRA driver gpu.example.com is registered with the kubelet "
        "(plugins_registry/gpu.example.com-reg.sock)",
    ),
    Case("auto, none", "auto", (), True, "no DRA GPU driver is registered with the kubelet"),
    Case(
        "auto, the registry unreadable",
        "auto",
        None,
        True,
        "the kubelet's plugin registry cannot be read: no DRA driver seen",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_device_plugin_wanted(case: Case) -> None:
    assert device_plugin_wanted(case.mode, case.found) == Decision(case.register, case.why)


def test_the_decision_reads_as_the_log_and_the_probes_say_it() -> None:
    off = device_plugin_wanted("auto", found(NVIDIA))
    assert off.log_line == (
        "device plugin off: DRA driver gpu.nvidia.com is registered with the kubelet "
        "(plugins_registry/gpu.nvidia.com-reg.sock)"
    )
    assert str(off).startswith("off: DRA driver gpu.nvidia.com")
    on = device_plugin_wanted("auto", ())
    assert on.log_line == "device plugin on: no DRA GPU driver is registered with the kubelet"
    assert str(on) == "registered: no DRA GPU driver is registered with the kubelet"


# --- the registry read ------------------------------------------------------------------------


@dataclass(frozen=True)
class Entries:
    id: str
    sockets: tuple[str, ...]
    others: tuple[str, ...]  # regular files and directories (names ending in / are directories)
    drivers: tuple[str, ...]
    seen: tuple[str, ...]  # the socket names found, in the order of drivers


ENTRIES = [
    Entries("empty", (), (), (NVIDIA,), ()),
    Entries("NVIDIA's driver", (f"{NVIDIA}-reg.sock",), (), (NVIDIA,), (f"{NVIDIA}-reg.sock",)),
    Entries(
        "beside other plugins",
        ("compute-domain.nvidia.com-reg.sock", "csi.example.com-reg.sock", f"{NVIDIA}-reg.sock"),
        (),
        (NVIDIA,),
        (f"{NVIDIA}-reg.sock",),
    ),
    Entries("another GPU driver only", ("gpu.example.com-reg.sock",), (), (NVIDIA,), ()),
    Entries(
        "a driver name that merely starts the same",
        (f"{NVIDIA}.example-reg.sock", f"{NVIDIA}x-reg.sock"),
        (),
        (NVIDIA,),
        (),
    ),
    Entries(
        "a suffix of the driver's choosing",
        (f"{NVIDIA}-1.sock",),
        (),
        (NVIDIA,),
        (f"{NVIDIA}-1.sock",),
    ),
    Entries(
        "a file or a directory is no registration",
        (),
        (f"{NVIDIA}-reg.sock", f"{NVIDIA}-dir/"),
        (NVIDIA,),
        (),
    ),
    Entries(
        "a dot file is ignored, as the kubelet does", (f".{NVIDIA}-reg.sock",), (), (NVIDIA,), ()
    ),
    Entries(
        "several drivers configured: in their order",
        ("gpu.example.com-reg.sock", f"{NVIDIA}-reg.sock"),
        (),
        (NVIDIA, "gpu.example.com"),
        (f"{NVIDIA}-reg.sock", "gpu.example.com-reg.sock"),
    ),
]


@pytest.mark.parametrize("case", ENTRIES, ids=[c.id for c in ENTRIES])
def test_registered_drivers(registry: Path, case: Entries) -> None:
    for name in case.sockets:
        a_socket(registry / name)
    for name in case.others:
        if name.endswith("/"):
            (registry / name).mkdir()
        else:
            (registry / name).write_text("")
    seen = registered_drivers(registry, case.drivers)
    assert seen is not None
    assert tuple(d.socket.name for d in seen) == case.seen
    assert all(d.socket.parent == registry for d in seen)
    assert all(d.socket.name.startswith(f"{d.driver}-") for d in seen)


def test_a_registry_that_is_not_there_cannot_be_read(registry: Path) -> None:
    assert registered_drivers(registry / "absent", [NVIDIA]) is None
    assert device_plugin_wanted("auto", None).register


# --- the switch: at start, and the grace a departed driver gets --------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def a_switch(
    registry: Path, mode: DevicePluginMode = "auto", *, gone_s: float = 30.0
) -> tuple[PluginSwitch, Clock, list[Decision]]:
    clock, changes = Clock(), list[Decision]()
    switch = PluginSwitch(
        mode,
        registry=registry,
        drivers=[NVIDIA],
        poll_s=1.0,
        gone_s=gone_s,
        on_change=changes.append,
        clock=clock,
    )
    return switch, clock, changes


def test_the_first_decision_is_logged_once(
    registry: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a_socket(registry / f"{NVIDIA}-reg.sock")
    switch, _, changes = a_switch(registry)
    with caplog.at_level("INFO", logger="schedext.agent"):
        decision = switch.start()
        assert switch.poll() == decision  # nothing changed: nothing logged
    assert not decision.register
    assert [r.getMessage() for r in caplog.records] == [
        f"device plugin off: DRA driver gpu.nvidia.com is registered with the kubelet "
        f"({registry.name}/gpu.nvidia.com-reg.sock)"
    ]
    assert changes == []  # the first decision is no change


def test_a_driver_that_appears_turns_the_plugin_off_at_the_next_read(registry: Path) -> None:
    switch, _, changes = a_switch(registry)
    assert switch.start().register
    reg = a_socket(registry / f"{NVIDIA}-reg.sock")
    assert not switch.poll().register
    assert [d.register for d in changes] == [False]
    assert reg.name in changes[0].why


def test_a_driver_that_goes_is_given_its_grace_before_the_plugin_registers_again(
    registry: Path,
) -> None:
    reg = a_socket(registry / f"{NVIDIA}-reg.sock")
    switch, clock, changes = a_switch(registry, gone_s=30.0)
    assert not switch.start().register
    reg.unlink()
    assert not switch.poll().register  # gone: the grace starts
    clock.now += 29.0
    assert not switch.poll().register
    clock.now += 1.0
    assert switch.poll().register
    assert [d.register for d in changes] == [True]


def test_a_driver_back_within_the_grace_changes_nothing(registry: Path) -> None:
    reg = a_socket(registry / f"{NVIDIA}-reg.sock")
    switch, clock, changes = a_switch(registry, gone_s=30.0)
    switch.start()
    reg.unlink()
    switch.poll()
    clock.now += 20.0
    a_socket(reg)  # its pod restarted
    assert not switch.poll().register
    reg.unlink()  # and goes again: a new grace, not the rest of the old one
    switch.poll()
    clock.now += 20.0
    assert not switch.poll().register
    assert changes == []


@pytest.mark.parametrize("mode", ["on", "off"])
def test_on_and_off_never_read_the_registry(registry: Path, mode: DevicePluginMode) -> None:
    a_socket(registry / f"{NVIDIA}-reg.sock")
    switch, _, _ = a_switch(registry, mode)
    assert switch.start().register == (mode == "on")
    switch.poll()
    assert switch.reads == 0


# --- settings and probes ----------------------------------------------------------------------


def test_the_settings_default_to_auto_with_nvidias_driver() -> None:
    chosen = settings()
    assert chosen.device_plugin == "auto"
    assert chosen.dra_drivers == [NVIDIA]
    assert chosen.plugins_registry_dir == REGISTRY


def test_the_drivers_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDEXT_AGENT_DRA_DRIVERS", json.dumps([NVIDIA, "gpu.example.com"]))
    monkeypatch.setenv("SCHEDEXT_AGENT_DEVICE_PLUGIN", "off")
    chosen = settings()
    assert chosen.dra_drivers == [NVIDIA, "gpu.example.com"]
    assert chosen.device_plugin == "off"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"device_plugin": "maybe"}, "'auto', 'on' or 'off'"),
        ({"dra_drivers": [""]}, "at least 1 character"),
        ({"dra_poll_s": 0}, "greater than 0"),
    ],
    ids=["an unknown mode", "an empty driver name", "no poll interval"],
)
def test_bad_dra_settings_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        settings(**values)


@pytest.mark.parametrize(
    ("decision", "shown", "sample"),
    [
        (None, None, None),
        (Decision(True, "no DRA GPU driver is registered with the kubelet"), "registered: no", 1.0),
        (Decision(False, "device_plugin is set to off"), "off: device_plugin is set to off", 0.0),
    ],
    ids=["undecided", "registered", "off"],
)
def test_the_probes_show_the_device_plugin(
    decision: Decision | None, shown: str | None, sample: float | None
) -> None:
    state = AgentState(
        ready=lambda: True, gpus=lambda: (), writes=lambda: 0, device_plugin=lambda: decision
    )
    answer = state.answer("ready")
    assert answer["status"] == "ready"
    if shown is None:
        assert "device_plugin" not in answer
    else:
        assert answer["device_plugin"].startswith(shown)
    text = generate_latest(metrics_registry(state)).decode()
    lines = [
        line
        for line in text.splitlines()
        if line.startswith("schedext_agent_device_plugin_registered ")
    ]
    assert lines == (
        [] if sample is None else [f"schedext_agent_device_plugin_registered {sample}"]
    )
