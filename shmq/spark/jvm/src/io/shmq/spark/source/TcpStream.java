package io.shmq.spark.source;

import io.shmq.spark.tcp.Connection;
import io.shmq.spark.tcp.Endpoint;
import io.shmq.spark.tcp.Frame;
import io.shmq.spark.tcp.MsgpackWriter;
import io.shmq.spark.tcp.Reconnect;
import io.shmq.spark.tcp.ServerException;
import io.shmq.spark.tcp.StreamMessages;
import io.shmq.spark.tcp.Wire;
import java.io.IOException;

/**
 * A stream read from a shmq server over TCP (an executor on another host): STREAM_INFO for the partition count,
 * OFFSETS for earliest and latest, READ by offset for the records. One connection, opened by {@link #connect};
 * a connection the server dropped meanwhile (its idle timeout, a restart) is opened again for the next request, at
 * once, then for as long as its {@link Reconnect} says (every request here only reads, so each may be made again).
 * Errors from the server are IOExceptions with its message; offsets no longer retained are a
 * {@link DataLossException} (a read that lost offsets after some it read returns those, and the next read raises
 * it).
 */
public final class TcpStream implements RecordSource {
    private final Endpoint endpoint;
    private final String token;
    private final String stream;
    private final Reconnect reconnect;
    private final String who;
    private final int partitions;
    private Connection conn;
    private boolean closed;

    private TcpStream(Endpoint endpoint, String token, String stream, Reconnect reconnect, String who,
                      Connection conn, int partitions) {
        this.endpoint = endpoint;
        this.token = token;
        this.stream = stream;
        this.reconnect = reconnect;
        this.who = who;
        this.conn = conn;
        this.partitions = partitions;
    }

    /**
     * Connects to {@code url} ({@code tcp://host:port}, or {@code tcps://host:port} trusting $SHMQ_TLS_CA) with
     * {@code token} (null: the url's, else $SHMQ_TOKEN, else this user's server's: Auth) and looks the stream up,
     * riding out an outage of the server as {@code reconnect} says (here and at every request); {@code who} names
     * the reader in its log line ("source (the driver)"). IllegalArgumentException for a bad url; IOException if
     * the server cannot be reached, refuses the token, or has no such stream.
     */
    public static TcpStream connect(String url, String token, String stream, Reconnect reconnect, String who)
            throws IOException {
        Endpoint endpoint = Endpoint.parse(url);
        Connection[] opened = new Connection[1];
        Runnable close = () -> {
            if (opened[0] != null) {
                opened[0].close();
            }
        };
        try {
            int partitions = reconnect.call(endpoint, who, () -> {
                opened[0] = Connection.open(endpoint, token);
                return StreamMessages.partitions(opened[0].call(Wire.STREAM_INFO, StreamMessages.streamInfo(stream)));
            }, close);
            return new TcpStream(endpoint, token, stream, reconnect, who, opened[0], partitions);
        } catch (IOException | RuntimeException e) {
            close.run();
            throw e;
        }
    }

    @Override
    public int partitions() {
        return partitions;
    }

    @Override
    public synchronized long earliest(int partition) throws IOException {
        return offsets(partition)[0];
    }

    @Override
    public synchronized long latest(int partition) throws IOException {
        return offsets(partition)[1];
    }

    private long[] offsets(int partition) throws IOException {
        return StreamMessages.offsets(call(Wire.OFFSETS, partition, -1, 0));
    }

    @Override
    public synchronized int read(int partition, long from, long until, int maxRecords, RecordBlock out)
            throws IOException {
        out.clear();
        long next = from;
        while (next < until && out.count < maxRecords) {
            int want = (int) Math.min(Math.min(until - next, maxRecords - out.count), StreamMessages.MAX_READ);
            Frame reply;
            try {
                reply = call(Wire.READ, partition, next, want);
            } catch (ServerException e) {
                if (e.status() != Wire.OFFSET_OUT_OF_RANGE) {
                    throw e;
                }
                if (e.earliest() > next) { // dropped by retention (or a gap of lost offsets)
                    if (out.count > 0) {
                        break; // what was read stands; the next read starts at the loss
                    }
                    throw lost(partition, next, e.earliest(), until);
                }
                throw new IOException("stream '" + stream + "' partition " + partition + " ends at " + e.end()
                        + ", before offset " + next + ": was it deleted and created again?", e);
            }
            int n = StreamMessages.records(reply, until, maxRecords - out.count, out);
            if (n == 0) { // the server passed over markers and aborted records up to the last stable offset, or the end
                if (offsets(partition)[1] >= until) {
                    next = until;
                }
                break;
            }
            next = out.offset[out.count - 1] + 1; // (records between are a transaction's marker or aborted ones)
        }
        out.next = next;
        return out.count;
    }

    private DataLossException lost(int partition, long from, long firstAvailable, long until) {
        return new DataLossException("stream '" + stream + "' partition " + partition + ": offsets " + from + ".."
                + (Math.min(firstAvailable, until) - 1) + " were dropped by retention (or lost) before they were read "
                + "(the oldest retained is " + firstAvailable + ")", firstAvailable);
    }

    /** OFFSETS (max < 1) or READ of one partition, on a connection opened again if the server dropped it. */
    private Frame call(int type, int partition, long offset, int max) throws IOException {
        if (partition < 0 || partition >= partitions) {
            throw new IllegalArgumentException("stream '" + stream + "' has partitions 0.." + (partitions - 1) + ", not "
                    + partition);
        }
        if (closed) {
            throw new IOException(this + " is closed");
        }
        MsgpackWriter request = type == Wire.READ ? StreamMessages.read(stream, partition, offset, max)
                : StreamMessages.offsets(stream, partition);
        return reconnect.call(endpoint, who, () -> {
            if (conn == null || conn.isClosed()) {
                conn = Connection.open(endpoint, token); // the server closed the last one (idle, or it restarted)
            }
            return conn.call(type, request);
        }, () -> {
            if (conn != null) {
                conn.close();
            }
        });
    }

    @Override
    public synchronized void close() {
        closed = true;
        if (conn != null) {
            conn.close();
        }
    }

    @Override
    public String toString() {
        return "TcpStream(" + endpoint.url + "/" + stream + ", " + partitions + " partitions)";
    }
}
