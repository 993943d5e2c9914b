"""Another process attached to a queue or stream before a test changes it: it runs the
script it was given with the namespace and the object's name, reads one command per line
and answers each with one line (``ask``); ``observers`` is the fixture that starts them
and kills what a failed test left."""

import os
import subprocess
import sys

import pytest


class Observer:
    def __init__(self, script, namespace, name):
        self.proc = subprocess.Popen([sys.executable, "-c", script, namespace, name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert self.proc.stdout.readline().strip() == "attached"

    def ask(self, cmd) -> str:
        """The answer line to ``cmd``, stripped."""
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the observer ended"
        return line.strip()

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0
        self.proc.stdout.close()


def observers(script):
    """A fixture: ``start(name)``, an Observer running ``script`` in the test's namespace."""
    @pytest.fixture
    def observer(broker):
        made = []

        def start(name):
            made.append(Observer(script, broker.namespace, name))
            return made[-1]

        yield start
        for o in made:
            if o.proc.poll() is None:
                o.proc.kill()
                o.proc.wait(30)
    return observer
