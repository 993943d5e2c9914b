package io.shmq.spark;

import io.shmq.spark.source.RecordSource;
import io.shmq.spark.source.ShmStream;
import io.shmq.spark.source.TcpStream;
import io.shmq.spark.tcp.Endpoint;
import io.shmq.spark.tcp.Reconnect;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.Serializable;
import java.nio.file.Files;
import java.nio.file.Paths;

/**
 * What a query reads and how its tasks reach it, shipped to every task: the stream, and where its records are
 * (a namespace's shared memory, or a shmq server by url, and how long to ride out its outage). {@link #open} picks
 * the {@link RecordSource}.
 */
public final class Target implements Serializable {
    private static final long serialVersionUID = 1L;
    private static final Logger LOG = LoggerFactory.getLogger("shmq.spark");

    public final String stream, namespace, url, token;
    public final boolean includeHeaders, failOnDataLoss;
    /** Over url: how long to keep trying to reach the server (option maxOutage); null with a namespace. */
    public final Reconnect reconnect;

    Target(SourceOptions opts) {
        stream = opts.stream;
        url = opts.url;
        token = opts.token;
        namespace = url == null ? opts.namespace() : null;
        reconnect = url == null ? null : Reconnect.of(opts.maxOutage());
        includeHeaders = opts.flag("includeHeaders", false);
        failOnDataLoss = opts.flag("failOnDataLoss", true);
    }

    /** Where the records are, for messages. */
    String where() {
        return url != null ? Endpoint.parse(url).url : "namespace " + SourceOptions.repr(namespace);
    }

    /**
     * The stream's records for {@code who} (the driver, or "partition N" of a task): the namespace's segments
     * mapped from /dev/shm, one mapping for the whole JVM ({@link ShmStream#shared}), when the query names a
     * namespace, over TCP ({@link TcpStream}) when it names a server's url. Logs which.
     */
    RecordSource open(String who) throws IOException {
        if (url != null) {
            RecordSource s = TcpStream.connect(url, token, stream, reconnect, "source (" + who + ")");
            LOG.info("shmq source: {} read over TCP ({})", who, Endpoint.parse(url).url);  // (never its token)
            return s;
        }
        try {
            RecordSource s = ShmStream.shared(namespace, stream);
            LOG.info("shmq source: {} read from shared memory (namespace {})", who, namespace);
            return s;
        } catch (FileNotFoundException e) {
            if (!Files.exists(Paths.get("/dev/shm", "shmq." + namespace + ".registry"))) {  // segment.py's names
                throw new ShmqSpecException("there is no shmq namespace " + SourceOptions.repr(namespace) + " on this "
                        + "host (nothing made a queue or stream in it): check .option('namespace', ...)");
            }
            throw new ShmqSpecException(e.getMessage() + ": check .option('stream', ...), or read it from another "
                    + "host with .option('url', 'tcp://HOST:PORT')");
        }
    }
}
