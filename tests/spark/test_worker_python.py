"""The Python Spark's workers run, as ``shmq.spark.register`` makes it: run as
``.venv/bin/python`` (the README's way, no venv activated), a plain session's workers
would start ``python3`` from PATH and fail to import shmq; register gives them this
interpreter when nothing chose one, and refuses, in one line, a chosen one that cannot
import shmq."""

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from shmq.spark.options import SpecError
from shmq.spark.session import java_home, worker_launcher, worker_python
from tests.spark._session import run_in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    import shmq, shmq.spark

    ns, scratch = sys.argv[1], sys.argv[2]
    b = shmq.connect(namespace=ns)
    b.create_stream("s", partitions=2, max_bytes=1 << 16).append_many([b"r%d" % i for i in range(25)])
    spark = (SparkSession.builder.master("local[1]").appName("worker-python")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.local.dir", scratch)
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    shmq.spark.register(spark)  # nothing chose the workers' Python: this one
    print("rows", spark.read.format("shmq").option("stream", "s").option("namespace", ns).load().count(), flush=True)
    spark.stop()
    b.close()
    shmq.destroy_namespace(ns)
""")


def _fake_session(python_exec, master="local[2]", conf=None):
    ctx = SimpleNamespace(pythonExec=python_exec, master=master, getConf=lambda: SimpleNamespace(
        get=lambda key, default=None: (conf or {}).get(key, default)))
    return SimpleNamespace(sparkContext=ctx)


@pytest.fixture
def shim(tmp_path):
    """A directory with a ``python3`` that is not this interpreter (it cannot import shmq)."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "python3").write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named posix_ipc' >&2\nexit 1\n")
    (d / "python3").chmod(0o755)
    return d


def test_nothing_chosen_gives_the_workers_this_interpreter_and_a_bad_choice_is_refused(monkeypatch, shim):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    s = _fake_session("python3")
    ours = worker_launcher() or sys.executable  # this interpreter, through its launcher where it has one
    assert worker_python(s) == ours and s.sparkContext.pythonExec == ours
    assert worker_python(_fake_session("python3", conf={"spark.pyspark.python": ours})) == ours
    s = _fake_session("python3", conf={"spark.pyspark.python": sys.executable})
    assert worker_python(s) == sys.executable
    bad = str(shim / "python3")
    with pytest.raises(SpecError, match=f"Spark's Python workers run {bad} .*, which cannot import shmq: "
                                        f"ModuleNotFoundError: No module named posix_ipc; set it to {sys.executable}"):
        worker_python(_fake_session(bad, conf={"spark.pyspark.python": bad}))
    monkeypatch.setenv("PYSPARK_PYTHON", bad)
    with pytest.raises(SpecError, match="cannot import shmq"):
        worker_python(_fake_session(bad))
    cluster = _fake_session("python3", master="spark://head:7077")
    assert worker_python(cluster) == "python3"  # a cluster's nodes: as configured
    assert worker_python(SimpleNamespace()) is None  # Spark Connect: no context here


@pytest.mark.slow
def test_a_plain_session_run_without_an_activated_venv_reads_through_register(shim, tmp_path):
    if java_home() is None:
        pytest.skip("Spark needs Java 17 (openjdk-17-jre-headless) and there is none")
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env.update(PATH=f"{shim}{os.pathsep}{env.get('PATH', '')}", JAVA_HOME=java_home(), SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=ROOT)
    ns = f"wp{os.getpid()}"
    try:
        p, out, err = run_in_session([sys.executable, "-c", DRIVER, ns, str(tmp_path / "scratch")], 240, cwd=ROOT,
                                     env=env)
    finally:
        import shmq

        shmq.destroy_namespace(ns)
    assert p.returncode == 0, err[-3000:]
    assert "rows 25" in out



def test_the_launcher_takes_only_the_installed_packages_zip_off_the_workers_path(tmp_path):
    """Spark puts SPARK_HOME/python/lib/pyspark.zip first on its workers' PYTHONPATH, and
    Python compiles what it imports from a zip anew in every process; the launcher runs
    this interpreter with the pip-installed package's zip (that package itself, compiled
    once) taken off, and nothing else."""
    import pyspark

    launcher = worker_launcher()
    if launcher is None:
        pytest.skip("this pyspark has no python/lib/pyspark.zip (it is a Spark distribution's)")
    assert launcher.startswith(os.environ["SHMQ_HOME"]) and os.stat(launcher).st_mode & 0o777 == 0o700
    assert worker_launcher() == launcher  # made once
    ours = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib", "pyspark.zip")
    other = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")  # another Spark's: kept
    probe = ("import os, sys, pyspark; "
             "print(os.environ.get('PYTHONPATH', '')); print(pyspark.__file__); print(sys.executable)")
    for path, left in [(f"{ours}:/a/py4j.zip:/b", "/a/py4j.zip:/b"), (f"/a:{ours}", "/a"), (ours, ""),
                       (f"{other}:/b", f"{other}:/b"), ("", "")]:
        out = subprocess.run([launcher, "-c", probe], env=dict(os.environ, PYTHONPATH=path), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [left, pyspark.__file__, sys.executable]


def test_the_sessions_workers_import_pyspark_from_its_package(spark):
    import pyspark

    if worker_launcher() is None:
        pytest.skip("this pyspark has no python/lib/pyspark.zip (it is a Spark distribution's)")
    where = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("pyspark").__file__).collect()
    assert where == [pyspark.__file__]
