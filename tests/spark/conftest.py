"""One SparkSession for the Spark tests (local[2], quiet; its scratch files under the
session's temporary directory; the JVM connector's jar on its class path where there is a
JDK), skipped, saying why, without pyspark or Java; and ``source`` and ``sink``, which run a
test on both sources or sinks: "shmq_python" (Python's) and "shmq" (the JVM's)."""

import pytest

from tests.conftest import SESSION_PROCESSES, _shared_folder

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'shmq[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'shmq[spark]')")

from shmq.spark.session import java_home, local_session  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _spark_classes(spark_classes):
    """Every Spark JVM of these tests, a session's or a driver process's, maps the archive."""
    return spark_classes


@pytest.fixture(scope="session")
def classes(request, tmp_path_factory):
    """The class path of the JVM connector's Java tests, compiled once a run (jvm_harness)."""
    from tests.spark.jvm_harness import compile_tests

    return compile_tests(_shared_folder(request, tmp_path_factory, "shmq-jvm-tests"))


@pytest.fixture(scope="session")
def spark(tmp_path_factory, _spark_classes):
    if java_home() is None:
        pytest.skip("Spark needs Java 17 (openjdk-17-jre-headless) and there is none")
    session = local_session("shmq-tests", str(tmp_path_factory.mktemp("spark")))
    gateway = session.sparkContext._gateway
    jvm = gateway.proc
    SESSION_PROCESSES.add(jvm.pid)
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()
    gateway.shutdown()
    jvm.stdin.close()  # the JVM exits at EOF on its stdin, not at gateway.shutdown()
    jvm.wait(30)
    SESSION_PROCESSES.discard(jvm.pid)


@pytest.fixture(scope="session")
def jvm(spark):
    """"shmq", the name of the JVM source in the session; skips (no JDK) or fails (a JDK,
    but the connector's jar did not build) where the session has not got it."""
    from shmq.spark.jar import javac

    if "shmq-spark-" not in spark.sparkContext.getConf().get("spark.jars", ""):
        if javac() is not None:
            pytest.fail("there is a JDK, but shmq.spark.jar() built no jar (its warning says why)")
        pytest.skip("no JDK (javac): the JVM source is off and format('shmq') is the Python source")
    return "shmq"


@pytest.fixture(params=["python", "jvm"])
def source(request):
    """The format name of the source under test: each test that takes it runs on both."""
    if request.param == "python":
        return "shmq_python"
    return request.getfixturevalue("jvm")


@pytest.fixture(params=["python", "jvm"])
def sink(request):
    """The format name of the sink under test: "shmq_python" (the Python sink) and "shmq" (the
    JVM sink, io.shmq.spark.sink): each test that takes it runs on both."""
    if request.param == "python":
        return "shmq_python"
    return request.getfixturevalue("jvm")


@pytest.fixture(autouse=True)
def _stop_queries(request):
    """Stop the streaming queries a test left running."""
    yield
    if "spark" in request.fixturenames:
        for q in request.getfixturevalue("spark").streams.active:
            q.stop()
