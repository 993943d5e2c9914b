package io.shmq.spark.sink;

import java.io.IOException;

/**
 * The fault tests' seam (tests/spark/test_exactly_once.py, as tests/spark/faults.py is the Python sink's): with
 * SHMQ_SPARK_SINK_FAULT set to "write:N" (a task of batch N spooled its rows) or "commit:N" (the driver had batch N
 * published, before Spark's commit log), the command SHMQ_SPARK_SINK_FAULT_CMD runs there (the tests' SIGKILL of the
 * whole driver session) and this thread waits for its end. Unset, nothing happens.
 */
final class Faults {
    private Faults() {
    }

    static void at(String point, long n) {
        String spec = System.getenv("SHMQ_SPARK_SINK_FAULT");
        String cmd = System.getenv("SHMQ_SPARK_SINK_FAULT_CMD");
        if (spec == null || cmd == null || !spec.equals(point + ":" + n)) {
            return;
        }
        try {
            new ProcessBuilder("/bin/sh", "-c", cmd).inheritIO().start().waitFor();
            Thread.sleep(Long.MAX_VALUE); // (killed by then)
        } catch (IOException | InterruptedException e) {
            throw new IllegalStateException("the fault command failed", e);
        }
    }
}
