"""Stop signals that come while the sidecar starts, before the service's own handlers: kept.

Python's default for SIGTERM ends the process at once (exit -15), and the imports and the
route map's parsing take a few hundred milliseconds before the service installs its own
handlers (:meth:`sidecar.service.Service.run`): a stop sent then (a rollout that changes its
mind, the fault suite's restart-and-stop) must still be a clean exit 0. :func:`hold` is the
first thing ``acemq-sidecar run`` and ``python -m sidecar run`` do (:mod:`sidecar.console`);
it only notes the signal, and the service, once its handlers are in place, acts on it.

It imports only the interpreter's built-in ``_signal``: :mod:`signal` would import
:mod:`enum` first, and those milliseconds are the window in which a SIGTERM still kills.
Before the interpreter runs its first line of ours a SIGTERM still ends it: nothing in a
Python program can change that.
"""

import _signal  # type: ignore[import-not-found]  # built in, no stub: signal without enum

__all__ = ["hold", "stop_requested"]

# SIGHUP too: its default would end the process as well; a reload while starting is moot,
# the route map being loaded is the newest.
_HELD = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)
_STOPS = frozenset({_signal.SIGTERM, _signal.SIGINT})
_received: set[int] = set()


def hold() -> None:
    """Note SIGTERM, SIGINT and SIGHUP from now on instead of dying of them."""
    for signum in _HELD:
        _signal.signal(signum, _note)


def _note(signum: int, _frame: object) -> None:
    _received.add(signum)


def stop_requested() -> bool:
    """Whether a SIGTERM or SIGINT came while the handlers of :func:`hold` were in place."""
    return not _STOPS.isdisjoint(_received)
