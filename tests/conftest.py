"""The suite's background jobs (tests/background.py): started once the run is collected, stopped at
its end."""

from __future__ import annotations

from . import background


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "background(*names): the test reads these background jobs' results (tests/background.py)"
    )


def pytest_collection_finish(session):
    background.prestart([name for item in session.items for m in item.iter_markers("background") for name in m.args])


def pytest_sessionfinish(session, exitstatus):
    background.stop()
