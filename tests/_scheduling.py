"""How xdist hands the suite's tests to its workers (a pytest plugin, conftest's): one or two
at a time, as ``--dist load`` does, except that the tests that use the Spark session
(``tests/spark/conftest.py``'s ``spark`` fixture) all go to one worker, as one unit. The
suite then starts one SparkSession, not one per worker: a session's JVM costs some 50-70
CPU-seconds over a run, its start, its compilers' warm-up and its idle threads.

Only the workers know which tests use a fixture (they collect; the controller sees names),
so each writes the names of those tests to a file the controller named, before it reports
its collection; the controller's scheduler reads it when it first schedules. xdist's own
``--dist loadgroup`` would do this with a mark, but does not group under pytest 9 (it renames
``item._nodeid``, which pytest no longer reads)."""

import json
import os
import shutil
import tempfile

import pytest

FIXTURE = "spark"
_FOLDER = pytest.StashKey[str]()  # the controller's: where the workers write the names
_INPUT = "shmq_session_tests"  # the workerinput key: the file of the names
_SCOPE = "(the tests of the Spark session)"


def pytest_configure(config):
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") == "load":
        config.stash[_FOLDER] = tempfile.mkdtemp(prefix="shmq-schedule-")


def pytest_unconfigure(config):
    folder = config.stash.get(_FOLDER, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    folder = node.config.stash.get(_FOLDER, None)
    if folder:
        node.workerinput[_INPUT] = os.path.join(folder, "tests.json")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    path = getattr(config, "workerinput", {}).get(_INPUT)
    if path:  # every worker collects the same tests: each writes the same file, whole (a rename)
        names = [item.nodeid for item in items if FIXTURE in getattr(item, "fixturenames", ())]
        part = f"{path}.{os.getpid()}"
        with open(part, "w") as f:
            json.dump(names, f)
        os.replace(part, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    folder = config.stash.get(_FOLDER, None)
    if folder:
        from xdist.scheduler import LoadScopeScheduling

        class OneSparkSession(LoadScopeScheduling):
            """Each test its own unit, but those of the Spark session one unit (the largest:
            xdist gives it out first)."""

            together: frozenset = frozenset()

            def schedule(self):
                if self.collection is None:
                    try:
                        with open(os.path.join(folder, "tests.json")) as f:
                            self.together = frozenset(json.load(f))
                    except FileNotFoundError:  # no worker collected: xdist reports why, as without this
                        pass
                super().schedule()

            def _split_scope(self, nodeid):
                return _SCOPE if nodeid in self.together else nodeid

        return OneSparkSession(config, log)
    return None
