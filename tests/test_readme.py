"""README.md's code blocks run as written, in order, in a fresh namespace: the broker of Set
up (its ``shmq server``; .ci/bare runs the whole command, install included), then First
use's commands, every Python block in one process (as one reader would type them, one
after the other), then the console block. What is changed is only where things are: the
``.venv/bin/`` prefix (the suite's own ``shmq``), the port 7878 (a free one), the Spark
checkpoint's folder; and the README stays short enough to read."""

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from shmq.engine.shm.segment import destroy_namespace
from tests.test_server_tcp import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^\1```", re.S | re.M)
MAX_LINES = 350


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def blocks():
    """(language, code) of every fenced block, in order, dedented."""
    return [(m.group(2), textwrap.dedent(m.group(3))) for m in FENCE.finditer(_readme())]


def test_the_readme_is_at_most_350_lines():
    assert _readme().count("\n") <= MAX_LINES


def test_the_blocks_are_set_up_then_shell_then_python_then_console():
    langs = [lang for lang, _ in blocks()]
    assert langs[:2] == ["sh", "sh"] and "pip install ." in blocks()[0][1]
    first_py, last_py = langs.index("python"), len(langs) - 1 - langs[::-1].index("python")
    assert set(langs[2:first_py]) == {"sh"} and set(langs[first_py:last_py + 1]) == {"python"}
    assert set(langs[last_py + 1:]) == {"console"}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_every_block_runs_as_written(namespace, tmp_path, request):
    pytest.importorskip("numpy")
    pytest.importorskip("pyspark")
    request.getfixturevalue("spark_classes")  # (its Spark block starts a JVM)
    port = _free_port()
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "shmq").write_text(f"#!/bin/sh\nexec {sys.executable} -m shmq.cli \"$@\"\n")
    (shim / "shmq").chmod(0o755)
    env = {**os.environ, "SHMQ_NAMESPACE": namespace, "PYTHONPATH": ROOT, "PATH": f"{shim}:{os.environ['PATH']}"}

    def placed(code):
        return (code.replace(".venv/bin/", "").replace("7878", str(port))
                .replace("/tmp/shmq-ck", str(tmp_path / "ck")))

    found = blocks()
    setup, _tests = found[0][1], found[1][1]
    assert setup.strip().endswith(".venv/bin/shmq server")
    srv = ServerProcess(namespace, "--port", str(port), env=env)  # Set up's broker, on the free port
    try:
        assert srv.port == port
        for lang, code in found[2:]:
            if lang == "sh":
                for line in placed(code).splitlines():
                    command = line.split("  #")[0].strip()
                    r = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=60,
                                       cwd=tmp_path)
                    assert r.returncode == 0, (command, r.stdout, r.stderr)
        python = "\n".join(placed(code) for lang, code in found if lang == "python")
        r = subprocess.run([sys.executable, "-"], input=python, capture_output=True, text=True, env=env, timeout=300,
                           cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "order #44" in r.stdout and "42\n" in r.stdout
        for lang, code in found:
            if lang == "console":
                for line in placed(code).splitlines():
                    command = line.removeprefix("$ ")
                    r = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=60,
                                       cwd=tmp_path)
                    ok = (0, 3) if " consume " in command else (0,)  # 3: consume's "no message came" (documented)
                    assert r.returncode in ok, (command, r.stdout, r.stderr)
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.stop() == 0
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(10)
        destroy_namespace(namespace)
