"""The JVM connector's jar (docs/SPARK.md, "The JVM source"): built from the Java sources shipped
with shmq (``shmq/spark/jvm``) by the JDK's ``javac``, against the jars of the pyspark installed,
once per Spark version and sources, into shmq's per-user directory.

Strategy: a pip user has a JDK or not, and no build tool; so no Maven, no download: ``javac
--release 17`` with pyspark's own jars on the class path, and a zip written here. The jar's
name holds the Spark version and a hash of every source and resource file (and of the defaults
that options.py gives the connector, written into it as ``DEFAULTS``), so a new shmq or a
new pyspark builds a new jar and an unchanged one is found at once. Builds take a file lock
(concurrent sessions build once) and land by atomic rename (no reader sees half a jar).
"""

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile

from .. import auth
from .options import jvm_defaults

__all__ = ["jar", "build", "javac", "SOURCES", "DEFAULTS"]

log = logging.getLogger("shmq.spark")

SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm")
_MANIFEST = "Manifest-Version: 1.0\nCreated-By: shmq.spark.jar\n"
DEFAULTS = "io/shmq/spark/defaults.properties"  # in the jar: options.py's defaults for the JVM (jvm_defaults)


def javac() -> str | None:
    """The JDK compiler: ``$JAVA_HOME/bin/javac`` when JAVA_HOME is set, else ``javac`` on PATH;
    None when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home:
        path = os.path.join(home, "bin", "javac")
        return path if os.access(path, os.X_OK) else None
    return shutil.which("javac")


def _spark():
    """(Spark's version, the folder of its jars) of the installed pyspark; None without one."""
    try:
        import pyspark
    except ImportError:
        return None
    jars = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")
    return (pyspark.__version__, jars) if os.path.isdir(jars) else None


def _files(root: str, sub: str, suffix: str = "") -> list:
    """Paths relative to ``root`` of the files under ``root/sub`` (ending in ``suffix``), sorted."""
    out = []
    for folder, _, names in os.walk(os.path.join(root, sub)):
        out += [os.path.relpath(os.path.join(folder, n), root) for n in names if n.endswith(suffix)]
    return sorted(out)


def jar() -> str | None:
    """The path of the connector's jar for the installed pyspark, built first if needed; None
    (and one warning line saying why) without a JDK or pyspark, or when the build fails: the
    Python source then serves ``format("shmq")``."""
    return build(SOURCES)


def build(root: str) -> str | None:
    """``jar()`` of the sources under ``root`` (``src/`` Java, ``resources/`` copied as they
    are): the jar in ``auth.home()/spark`` named by Spark's version and the sources' hash."""
    compiler, spark = javac(), _spark()
    if compiler is None or spark is None:
        why = ("there is no JDK (javac): install openjdk-17-jdk-headless or set JAVA_HOME to a JDK"
               if spark else "pyspark is not installed")
        log.warning("shmq.spark: the JVM source is off, format('shmq') is the Python source: %s", why)
        return None
    version, jars = spark
    sources, resources = _files(root, "src", ".java"), _files(root, "resources")
    digest = hashlib.sha256(version.encode())
    for rel in sources + resources:
        with open(os.path.join(root, rel), "rb") as f:
            digest.update(rel.encode() + b"\0" + f.read() + b"\0")
    digest.update(DEFAULTS.encode() + b"\0" + jvm_defaults().encode() + b"\0")
    folder = os.path.join(auth.home(), "spark")
    path = os.path.join(folder, f"shmq-spark-{version}-{digest.hexdigest()[:16]}.jar")
    if os.path.exists(path):
        return path
    os.makedirs(auth.home(), mode=0o700, exist_ok=True)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(folder, "jar.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not os.path.exists(path):  # another process built it while this one waited
            why = _compile(compiler, jars, root, sources, resources, path)
            if why is not None:
                log.warning("shmq.spark: the JVM source is off, format('shmq') is the Python source: %s", why)
                return None
            _prune(folder, f"shmq-spark-{version}-", path)
    finally:
        os.close(fd)
    return path


def _prune(folder: str, prefix: str, keep: str) -> None:
    """Remove the jars of older sources for this Spark version (a session that loaded one keeps
    its open file), so a per-user folder holds one jar per Spark version."""
    for name in os.listdir(folder):
        old = os.path.join(folder, name)
        if name.startswith(prefix) and name.endswith(".jar") and old != keep:
            try:
                os.unlink(old)
            except FileNotFoundError:
                pass


def _compile(compiler: str, jars: str, root: str, sources: list, resources: list, path: str) -> str | None:
    """Compile and write the jar at ``path`` (atomically); None, or why it failed in a line."""
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path), prefix=".build-") as tmp:
        classes = os.path.join(tmp, "classes")
        args = os.path.join(tmp, "args")
        with open(args, "w") as f:  # an argument file: no command-line length limit
            f.write("\n".join(f'"{os.path.join(root, s)}"' for s in sources))
        try:
            out = subprocess.run([compiler, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp",
                                  os.path.join(jars, "*"), "-d", classes, "@" + args],
                                 capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            return f"{compiler} could not run ({e})"
        if out.returncode != 0:
            first = next((line for line in out.stderr.splitlines() if "error" in line), out.stderr.strip())
            return f"javac failed on the connector's sources: {first}"
        part = os.path.join(tmp, "jar")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", _MANIFEST)
            for rel in _files(classes, "."):
                z.write(os.path.join(classes, rel), os.path.normpath(rel))
            for rel in resources:
                z.write(os.path.join(root, rel), os.path.relpath(rel, "resources"))
            z.writestr(DEFAULTS, jvm_defaults())
        os.chmod(part, 0o600)
        os.replace(part, path)
    return None
