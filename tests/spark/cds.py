"""Class data sharing for the suite's Spark JVMs: an archive of the classes a Spark start
loads, written once (per JDK, pyspark and these options) into pytest's cache folder, and
mapped by every later start through ``SPARK_SUBMIT_OPTS``, which Spark's launcher passes to
the driver's JVM; the environment carries it to the drivers the tests start as processes.
Measured on the 2-core machine: a local session and its first job, 19 s -> 9.5 s."""

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile

# a short-lived JVM on few cores: the C1 compiler only, one GC thread
OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# the start whose classes are archived: a session, a batch job, a streaming query
_WARM_UP = """
import sys
from shmq.spark import local_session
spark = local_session("shmq-class-archive", sys.argv[1])
df = spark.range(100)
df.groupBy((df.id % 3).alias("k")).count().collect()
q = spark.readStream.format("rate").load().writeStream.format("noop").trigger(once=True).start()
q.awaitTermination(120)
gateway = spark.sparkContext._gateway
spark.stop()
gateway.shutdown()
gateway.proc.stdin.close()  # the JVM exits at EOF on its stdin, and writes the archive as it exits
gateway.proc.wait(120)
"""


def _key(java: str) -> str:
    import pyspark

    java = os.path.realpath(java)
    return hashlib.sha256(f"{pyspark.__version__}\0{java}\0{os.stat(java).st_mtime_ns}\0{OPTIONS}".encode()).hexdigest()[:16]


def share_classes(folder) -> str | None:
    """The JVM options (for ``SPARK_SUBMIT_OPTS``) that map the archive in ``folder``, written
    first if there is none (one process writes, the others wait); None without Java or
    pyspark, or where the JVM wrote none (the starts then load their classes as before)."""
    from shmq.spark.session import java_home

    home = java_home()
    if home is None:
        return None
    try:
        archive = os.path.join(folder, f"spark-{_key(os.path.join(home, 'bin', 'java'))}.jsa")
    except (ImportError, OSError):
        return None
    fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not os.path.exists(archive):
            with tempfile.TemporaryDirectory(dir=folder, prefix=".scratch-") as scratch:
                part = os.path.join(scratch, "part.jsa")
                env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{OPTIONS} -XX:ArchiveClassesAtExit={part}"}
                subprocess.run([sys.executable, "-c", _WARM_UP, scratch], env=env, capture_output=True, timeout=300)
                if not os.path.exists(part):
                    return None
                os.replace(part, archive)
    finally:
        os.close(fd)
    return f"{OPTIONS} -XX:SharedArchiveFile={archive}"
