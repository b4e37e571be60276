"""The route map file as a reload sees it: noticed when it changes, read again on demand."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from sidecar.errors import ConfigError
from sidecar.route_files import RouteMapFile

if TYPE_CHECKING:
    from pathlib import Path

MAP = """\
broker: {url: 'amqp://guest:guest@127.0.0.1:5672/'}
quarantine: {exchange: q}
routes:
  - {name: orders, from: s.orders, to: {exchange: orders}}
"""


@pytest.fixture
def path(tmp_path: Path) -> Path:
    path = tmp_path / "routes.yaml"
    path.write_text(MAP)
    return path


def test_an_untouched_file_has_not_changed(path: Path) -> None:
    """The poller reloads nothing while nobody edits the file."""
    config = RouteMapFile(path, env={})
    assert not config.changed()
    assert not config.changed()


def test_an_edit_is_seen_once(path: Path) -> None:
    """One edit, one reload: the next look sees nothing new."""
    config = RouteMapFile(path, env={})
    path.write_text(MAP + "# edited\n")
    assert config.changed()
    assert not config.changed()


def test_a_read_counts_as_a_look(path: Path) -> None:
    """An edit followed by SIGHUP is one reload: the poller skips what the reload read."""
    config = RouteMapFile(path, env={})
    path.write_text(MAP + "# edited\n")
    route_map = config.load()
    assert route_map is not None
    assert [route.name for route in route_map.routes] == ["orders"]
    assert not config.changed()


def test_a_vanished_file_is_no_change_and_a_refused_reload(path: Path) -> None:
    """A ConfigMap swap may unlink the file for a moment: no reload, and a read refuses it."""
    config = RouteMapFile(path, env={})
    path.unlink()
    assert not config.changed()
    with pytest.raises(ConfigError):
        config.load()


def test_without_a_file_there_is_nothing_to_reload() -> None:
    """A map that came from elsewhere: SIGHUP and the poller change nothing."""
    config = RouteMapFile(None, env={})
    assert not config.changed()
    assert config.load() is None


@pytest.mark.timeout(10)
async def test_the_watcher_sets_the_event_on_an_edit_and_ends_on_stop(path: Path) -> None:
    """What a ConfigMap update does: the next poll asks for a reload; SIGTERM ends the watch."""
    config = RouteMapFile(path, env={})
    changed, stop = asyncio.Event(), asyncio.Event()
    watcher = asyncio.create_task(config.watch(changed, stop=stop, poll_s=0.01), name="watch")
    await asyncio.sleep(0.05)  # a few polls of the file as it was
    assert not changed.is_set(), "a reload asked for with no edit"
    await asyncio.to_thread(path.write_text, MAP + "# edited\n")
    async with asyncio.timeout(5):
        await changed.wait()
    stop.set()
    async with asyncio.timeout(5):
        await watcher
    assert watcher.done()
