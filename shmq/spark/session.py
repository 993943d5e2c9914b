"""A local SparkSession with the settings that keep it quiet and fast on one host
(docs/SPARK.md, "Running locally"): UI off, loopback only, UTC, two shuffle partitions,
scratch files and the JVM's temporary files under one directory of the caller's."""

import hashlib
import os
import shlex
import shutil
import subprocess
import sys

from .. import auth

__all__ = ["local_session", "worker_python", "worker_launcher", "JAVA_HOME_DEFAULT"]

JAVA_HOME_DEFAULT = "/usr/lib/jvm/java-17-openjdk-amd64"
_LOG4J = "rootLogger.level = error\nrootLogger.appenderRef.stderr.ref = console\n" \
         "appender.console.type = Console\nappender.console.name = console\nappender.console.target = SYSTEM_ERR\n" \
         "appender.console.layout.type = PatternLayout\nappender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"


def java_home() -> str | None:
    """$JAVA_HOME, else OpenJDK 17's usual place, else the directory above ``java`` on
    PATH; None when there is no Java."""
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return home
    if os.path.exists(os.path.join(JAVA_HOME_DEFAULT, "bin", "java")):
        return JAVA_HOME_DEFAULT
    java = shutil.which("java")
    return os.path.dirname(os.path.dirname(os.path.realpath(java))) if java else None


_LAUNCHER = """#!/bin/sh
# Made by shmq.spark (docs/SPARK.md, "Running locally"): Spark's Python workers run
# @PYTHON@, importing pyspark from its installed, compiled files, not from pyspark.zip.
z=@ZIP@
p=":$PYTHONPATH:"
case "$p" in
*":$z:"*) p="${p%%":$z:"*}:${p#*":$z:"}"; p="${p#:}"; PYTHONPATH="${p%:}"; export PYTHONPATH;;
esac
exec @PYTHON@ "$@"
"""


def worker_launcher() -> str | None:
    """A launcher (a shell script in ``auth.home()/spark``, owner-only) of this
    interpreter for Spark's Python workers, which takes the installed pyspark package's
    own ``python/lib/pyspark.zip`` off their PYTHONPATH: Spark puts it first there
    (SPARK_HOME is that package when pyspark was installed by pip) and Python compiles
    every module it imports from a zip anew in each process, while the package's own
    files are compiled once. The two are one copy of pyspark: nothing else changes.
    None where there is no such zip (pyspark from a Spark distribution) or the launcher
    cannot be written."""
    try:
        import pyspark
    except ImportError:
        return None
    package = os.path.dirname(os.path.abspath(pyspark.__file__))
    zip_path = os.path.join(package, "python", "lib", "pyspark.zip")
    if not os.path.isfile(zip_path):
        return None
    text = _LAUNCHER.replace("@PYTHON@", shlex.quote(sys.executable)).replace("@ZIP@", shlex.quote(zip_path))
    folder = os.path.join(auth.home(), "spark")
    path = os.path.join(folder, "python-" + hashlib.sha256(text.encode()).hexdigest()[:16])
    if os.path.exists(path):
        return path
    try:
        os.makedirs(auth.home(), mode=0o700, exist_ok=True)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o700)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def _chosen_python(spark) -> str | None:
    """The Python the user chose for Spark's workers, or None when nothing chose it."""
    conf = spark.sparkContext.getConf()
    return os.environ.get("PYSPARK_PYTHON") or conf.get("spark.pyspark.python", None)


def _imports_shmq(python: str) -> str | None:
    """None if ``python`` imports shmq's Spark data sources; else why not, in a line."""
    try:
        out = subprocess.run([python, "-c", "import shmq.spark.datasource"], capture_output=True, text=True,
                             timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return f"it cannot be run ({e})"
    if out.returncode == 0:
        return None
    lines = out.stderr.strip().splitlines()
    return lines[-1] if lines else f"it exits with status {out.returncode}"


def worker_python(spark) -> str | None:
    """The Python Spark's workers run for this session, made one that imports shmq when
    it can be told: on a local master where nothing chose it (``PYSPARK_PYTHON``,
    ``spark.pyspark.python``), this interpreter (through ``worker_launcher`` where it
    can), from now on (data sources registered after this call, and UDFs). A chosen
    Python that cannot import shmq is refused: a SpecError saying which and how to fix
    it, instead of tasks failing with a worker's traceback. A cluster's workers are
    left as configured (shmq must be installed on every node). Returns the Python, or
    None for a session without a SparkContext."""
    from .options import SpecError

    sc = getattr(spark, "sparkContext", None)
    if sc is None or not hasattr(sc, "pythonExec"):  # Spark Connect: the server's workers
        return None
    if not sc.master.startswith("local"):
        return sc.pythonExec
    chosen = _chosen_python(spark)
    launcher = worker_launcher()
    if chosen is None:
        sc.pythonExec = launcher or sys.executable
        return sc.pythonExec
    ours = {os.path.realpath(p) for p in (sys.executable, launcher) if p}
    if os.path.realpath(shutil.which(chosen) or chosen) not in ours:
        why = _imports_shmq(chosen)
        if why is not None:
            raise SpecError(f"Spark's Python workers run {chosen} (PYSPARK_PYTHON or spark.pyspark.python), which "
                            f"cannot import shmq: {why}; set it to {sys.executable}, or install 'shmq[spark]' there")
    return chosen


def local_session(app_name: str, scratch: str, master: str = "local[2]", conf: dict | None = None,
                  jvm_source: bool = True):
    """Start (or get) a SparkSession on ``master`` whose scratch space, JVM temporary
    files and log settings live under the directory ``scratch``; registers shmq's data
    sources. With ``jvm_source`` (and a JDK), the connector's jar (``shmq.spark.jar``) is
    added to ``spark.jars``, so "shmq" is the JVM source. Environment it needs is set
    here: JAVA_HOME, TZ=UTC, SPARK_LOCAL_IP, PYSPARK_PYTHON (this interpreter, through
    ``worker_launcher``, so workers import the same shmq; a Python chosen before is
    kept, and refused if it cannot import shmq: ``worker_python``)."""
    from pyspark.sql import SparkSession

    from . import register
    from .jar import jar

    home = java_home()
    if home is None:
        raise RuntimeError("Spark needs Java 17: install openjdk-17-jre-headless or set JAVA_HOME")
    os.makedirs(scratch, exist_ok=True)
    log4j = os.path.join(scratch, "log4j2.properties")
    with open(log4j, "w") as f:
        f.write(_LOG4J)
    os.environ.setdefault("JAVA_HOME", home)
    os.environ["TZ"] = "UTC"
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", worker_launcher() or sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    java_opts = f"-Djava.io.tmpdir={scratch} -Dlog4j2.configurationFile=file:{log4j}"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.local.dir": scratch,
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    settings.update(conf or {})
    connector = jar() if jvm_source else None
    if connector is not None:
        settings["spark.jars"] = ",".join(j for j in (settings.get("spark.jars"), connector) if j)
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
