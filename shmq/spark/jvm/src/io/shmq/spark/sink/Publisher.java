package io.shmq.spark.sink;

import io.shmq.spark.ShmqSpecException;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.classic.SparkSession;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * The driver's side of the JVM sink's publisher: one {@code python -m shmq.spark.publisher} process per driver JVM
 * (shmq/spark/publisher.py), started on first use and again if it died, its requests and replies JSON lines. It
 * appends what the tasks spooled in C, where a partition's lock is taken (the JVM does not take shmq's robust
 * process-shared mutex). Its Python: spark.shmq.python (shmq.spark.register sets it to the Python of the session's
 * workers), else PYSPARK_PYTHON, else spark.pyspark.python, else python3.
 */
final class Publisher {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static Publisher current;

    private final Process process;
    private final BufferedWriter requests;
    private final BufferedReader replies;
    private long next;

    private Publisher(String python) throws IOException {
        ProcessBuilder pb = new ProcessBuilder(python, "-m", "shmq.spark.publisher");
        pb.redirectError(ProcessBuilder.Redirect.INHERIT);
        process = pb.start();
        requests = new BufferedWriter(new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8));
        replies = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
    }

    /** The Python the publisher runs (see the class's comment). */
    static String python() {
        String chosen = null;
        try {
            SparkSession active = SparkSession.active();
            chosen = active.conf().get("spark.shmq.python", null);
            if (chosen == null && System.getenv("PYSPARK_PYTHON") == null) {
                chosen = active.sparkContext().getConf().get("spark.pyspark.python", null);
            }
        } catch (Exception e) { // (Spark's SparkException, which Java does not see thrown)
            // no active session (a test's own JVM): the environment says
        }
        if (chosen == null) {
            chosen = System.getenv("PYSPARK_PYTHON");
        }
        return chosen == null || chosen.isEmpty() ? "python3" : chosen;
    }

    /** The publisher of this JVM, started if there is none alive. */
    static synchronized Publisher get() {
        if (current == null || !current.process.isAlive()) {
            String python = python();
            try {
                current = new Publisher(python);
            } catch (IOException e) {
                throw new IllegalStateException("the shmq sink cannot start its publisher (" + python
                        + " -m shmq.spark.publisher): " + e.getMessage() + "; set spark.shmq.python to a Python with "
                        + "shmq installed (shmq.spark.register does)", e);
            }
            Runtime.getRuntime().addShutdownHook(new Thread(current::stop, "shmq-publisher-stop"));
        }
        return current;
    }

    private void stop() {
        try {
            requests.close(); // (it ends at EOF)
        } catch (IOException e) {
            // gone already
        }
    }

    /** A new request of {@code op}, its id set. */
    synchronized ObjectNode request(String op) {
        ObjectNode req = JSON.createObjectNode();
        req.put("id", ++next);
        req.put("op", op);
        return req;
    }

    /**
     * Send {@code req} and wait for its reply: the reply, or ShmqSpecException (a bad option or target) or
     * IllegalStateException (anything else) with the publisher's one-line message. A publisher that died on the way
     * is started again and asked again: every request is idempotent (a publish is once per query and batch).
     */
    JsonNode call(ObjectNode req) {
        JsonNode reply;
        synchronized (this) {
            reply = exchange(req);
        }
        if (reply == null) {
            Publisher again = get();
            synchronized (again) {
                reply = again.exchange(req);
            }
            if (reply == null) {
                throw new IllegalStateException("the shmq sink's publisher ended without answering (its errors are on "
                        + "the driver's stderr)");
            }
        }
        JsonNode error = reply.get("error");
        if (error != null) {
            String kind = reply.path("kind").asText("");
            if (kind.equals("spec")) {
                throw new ShmqSpecException(error.asText());
            }
            throw new IllegalStateException(error.asText());
        }
        return reply;
    }

    private JsonNode exchange(ObjectNode req) {
        try {
            requests.write(JSON.writeValueAsString(req));
            requests.write('\n');
            requests.flush();
            String line;
            while ((line = replies.readLine()) != null) {
                JsonNode reply = JSON.readTree(line);
                if (reply.path("id").asLong(-1) == req.path("id").asLong()) {
                    return reply;
                }
            }
            return null;
        } catch (IOException e) {
            return null;
        }
    }

    /** The spools of {@code messages} as a request's list. */
    static void spools(ObjectNode req, List<Spool> spools) {
        var list = req.putArray("spools");
        for (Spool s : spools) {
            ObjectNode o = list.addObject();
            o.put("path", s.path);
            o.put("task", s.task);
        }
    }
}
