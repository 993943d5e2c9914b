package io.shmq.spark.sink;

import io.shmq.spark.ShmqSpecException;
import io.shmq.spark.SourceOptions;

import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.File;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The "shmq" sink in the JVM (issue 46): {@code df.write.format("shmq")} and {@code df.writeStream.format("shmq")}.
 * Each task spools its rows into /dev/shm ({@link SpoolWriter}); the driver's commit hands a batch's spools to the
 * publisher ({@link Publisher}, shmq/spark/publisher.py), which appends them in C, per partition of the stream all at
 * once, noting (query, batch) there in the same step: a micro-batch retried after an executor or the driver was
 * killed lands once (the Python sink's contract, docs/SPARK.md). Rows go to the partition of their partition
 * column, else of their key's murmur2 (Kafka's), else of their task; a queue gets them put, at least once. Options
 * and errors are the Python sink's (options.py's SINK, writer.py's checks), looked at here before a task runs.
 */
public final class SinkWrite implements WriteBuilder, SupportsTruncate, Write {
    private static final Logger LOG = LoggerFactory.getLogger("shmq.spark");
    private static final String[][] COLUMNS = {{"value", "binary", "string"}, {"key", "binary", "string"},
            {"partition", "int", "bigint", "smallint"}, {"headers", "map<string,string>"}};

    /** The streaming queries (id and options) whose target the publisher has checked: Spark builds the write anew
     * for every micro-batch, and the check (a round trip to the publisher, ~5 ms in a busy driver) is the first's. */
    private static final Set<String> CHECKED = ConcurrentHashMap.newKeySet();
    private static final int CHECKED_MOST = 1024;

    private final LogicalWriteInfo info;
    private final SourceOptions opts;
    private final Map<String, String> raw;

    public SinkWrite(LogicalWriteInfo info) {
        this.info = info;
        this.raw = info.options().asCaseSensitiveMap();
        this.opts = new SourceOptions(raw);
        opts.refuseUnknown(SourceOptions.SINK);
        checkColumns(info.schema(), opts.stream != null ? "stream " + repr(opts.stream) : "queue " + repr(opts.queue));
    }

    /** writer.py's _check_columns: a value column, and each known column of its types. */
    static void checkColumns(StructType schema, String target) {
        Map<String, String> types = new java.util.LinkedHashMap<>();
        for (StructField f : schema.fields()) {
            types.put(f.name().toLowerCase(Locale.ROOT), f.dataType().simpleString());
        }
        if (!types.containsKey("value")) {
            throw new ShmqSpecException("the shmq sink into " + target + " needs a 'value' column (binary or string); "
                    + "the columns are " + (types.isEmpty() ? "none" : String.join(", ", types.keySet())));
        }
        for (String[] c : COLUMNS) {
            String t = types.get(c[0]);
            if (t == null) {
                continue;
            }
            boolean ok = false;
            for (int i = 1; i < c.length; i++) {
                ok |= c[i].equals(t);
            }
            if (!ok) {
                String[] allowed = java.util.Arrays.copyOfRange(c, 1, c.length);
                throw new ShmqSpecException("the shmq sink's '" + c[0] + "' column must be "
                        + String.join(" or ", allowed) + ", not " + t);
            }
        }
    }

    private static String repr(String s) {
        return "'" + s.replace("'", "\\'") + "'";
    }

    @Override
    public WriteBuilder truncate() {
        throw new ShmqSpecException("the shmq sink appends: use mode('append')");
    }

    @Override
    public Write build() {
        return this;
    }

    @Override
    public String description() {
        return "shmq sink into " + (opts.stream != null ? "stream " + opts.stream : "queue " + opts.queue);
    }

    @Override
    public BatchWrite toBatch() {
        return new Batch(UUID.randomUUID().toString());
    }

    @Override
    public StreamingWrite toStreaming() {
        return new Streaming(info.queryId());
    }

    /** Where this write's spools go: beside the namespace's shared memory (counted as its own), or for a url under a
     * name of their own; the spools of dead drivers found there first are deleted. */
    private String spoolPrefix(String txn) {
        File dir = new File("/dev/shm");
        if (!dir.isDirectory()) {
            dir = new File(System.getProperty("java.io.tmpdir"));
        }
        String base = opts.url == null ? "shmq." + opts.namespace() + ".spark-spool." : "shmq-spark-spool.";
        String[] left = dir.list((d, name) -> name.startsWith(base));
        if (left != null) {
            for (String name : left) {
                String[] parts = name.substring(base.length()).split("\\.");
                try {
                    long pid = Long.parseLong(parts[0]);
                    Optional<ProcessHandle> p = ProcessHandle.of(pid);
                    if (p.isEmpty() || !p.get().isAlive() || (parts.length > 1 && parts[1].equals(txn))) {
                        new File(dir, name).delete(); // a killed driver's, or this query's earlier run's
                    }
                } catch (NumberFormatException e) {
                    // not one of ours
                }
            }
        }
        return new File(dir, base + ProcessHandle.current().pid() + "." + txn).getPath();
    }

    /**
     * Delete what is left of batches up to {@code epoch} under {@code prefix} once this batch is published or aborted:
     * the spools of task attempts whose commit messages Spark did not keep (a speculative or a zombie attempt of a
     * partition another attempt committed; without the commit coordinator each attempt commits its own spool).
     */
    private static void sweep(String prefix, long epoch) {
        File at = new File(prefix);
        String base = at.getName() + ".";
        String[] left = at.getParentFile().list((d, name) -> name.startsWith(base));
        if (left == null) {
            return;
        }
        for (String name : left) {
            String rest = name.substring(base.length());
            int dot = rest.indexOf('.');
            try {
                if (dot > 0 && Long.parseLong(rest.substring(0, dot)) <= epoch) {
                    new File(at.getParentFile(), name).delete();
                }
            } catch (NumberFormatException e) {
                // not a spool of this write
            }
        }
    }

    private void check(Publisher publisher) {
        ObjectNode req = publisher.request("check");
        options(req);
        publisher.call(req);
    }

    private void options(ObjectNode req) {
        ObjectNode o = req.putObject("options");
        for (Map.Entry<String, String> e : raw.entrySet()) {
            o.put(e.getKey(), e.getValue());
        }
    }

    private static String timeZone() {
        return SparkSession.active().sessionState().conf().sessionLocalTimeZone();
    }

    /** Publish (or put) the spools of batch {@code batch} of {@code txn}: once per (txn, batch). */
    private void publish(String txn, long batch, List<Spool> spools) {
        if (spools.isEmpty()) {
            return; // nothing was written: nothing to publish
        }
        Publisher publisher = Publisher.get();
        ObjectNode req = publisher.request(opts.queue != null ? "put" : "publish");
        options(req);
        req.put("txn", txn);
        req.put("batch", batch);
        Publisher.spools(req, spools);
        publisher.call(req);
    }

    private final class Batch implements BatchWrite {
        private final String job;
        private final String prefix;

        Batch(String job) {
            this.job = job;
            check(Publisher.get());
            this.prefix = spoolPrefix(job);
        }

        @Override
        public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo physical) {
            return new SpoolWriter.Factory(info.schema(), timeZone(), prefix);
        }

        @Override
        public boolean useCommitCoordinator() {
            return false; // (the driver's commit publishes one spool a partition: Spark keeps one message each)
        }

        @Override
        public void commit(WriterCommitMessage[] messages) {
            List<Spool> spools = Spool.of(messages);
            try {
                publish(job, 0, spools);
                Faults.at("commit", 0);
            } finally {
                Spool.delete(spools);
                sweep(prefix, 0);
            }
        }

        @Override
        public void abort(WriterCommitMessage[] messages) {
            Spool.delete(Spool.of(messages));
            sweep(prefix, 0);
        }
    }

    private final class Streaming implements StreamingWrite {
        private final String query;
        private final String prefix;

        Streaming(String query) {
            this.query = query;
            String key = query + "\n" + new TreeMap<>(raw);
            if (!CHECKED.contains(key)) {
                check(Publisher.get());
                if (CHECKED.size() >= CHECKED_MOST) {
                    CHECKED.clear(); // (a driver that ran that many queries: each checks again)
                }
                CHECKED.add(key);
            }
            this.prefix = spoolPrefix(query);
        }

        @Override
        public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo physical) {
            return new SpoolWriter.Factory(info.schema(), timeZone(), prefix);
        }

        @Override
        public boolean useCommitCoordinator() {
            return false; // (the driver's commit publishes one spool a partition: Spark keeps one message each)
        }

        @Override
        public void commit(long epochId, WriterCommitMessage[] messages) {
            List<Spool> spools = Spool.of(messages);
            try {
                publish(query, epochId, spools);
            } finally {
                Spool.delete(spools);
                sweep(prefix, epochId);
            }
            Faults.at("commit", epochId);
        }

        @Override
        public void abort(long epochId, WriterCommitMessage[] messages) {
            LOG.warn("shmq sink: batch {} of the query into {} aborted; nothing of it was published", epochId,
                    opts.stream != null ? "stream '" + opts.stream + "'" : "queue '" + opts.queue + "'");
            Spool.delete(Spool.of(messages));
            sweep(prefix, epochId);
        }
    }
}
