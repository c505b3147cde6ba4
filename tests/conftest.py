"""The suite's background jobs (tests/background.py): the tests that read them run last, the jobs start
once the run is collected and stop at its end."""

from __future__ import annotations

from . import background


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "background(*names): the test reads these background jobs' results (tests/background.py)"
    )


def pytest_collection_modifyitems(session, config, items):
    items[:] = background.reads_last(items)


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    background.prestart([name for item in session.items for m in item.iter_markers("background") for name in m.args])


def pytest_sessionfinish(session, exitstatus):
    background.stop()
