package io.shmq.spark.tcp;

import java.io.IOException;

/** The server answered a request with an error: its status code and its message (the exception's message says
 *  which server, then the server's words). OFFSET_OUT_OF_RANGE also carries the partition's earliest and end. */
public final class ServerException extends IOException {
    private static final long serialVersionUID = 1L;
    private final int status;
    private final String serverMessage;
    private final long earliest;
    private final long end;

    public ServerException(String endpoint, int status, String serverMessage, long earliest, long end) {
        super(endpoint + ": " + Wire.statusName(status) + ": " + serverMessage);
        this.status = status;
        this.serverMessage = serverMessage;
        this.earliest = earliest;
        this.end = end;
    }

    public int status() {
        return status;
    }

    /** The server's own words. */
    public String serverMessage() {
        return serverMessage;
    }

    /** OFFSET_OUT_OF_RANGE: the partition's oldest retained offset (-1 for other errors). */
    public long earliest() {
        return earliest;
    }

    /** OFFSET_OUT_OF_RANGE: the offset the partition's next append gets (-1 for other errors). */
    public long end() {
        return end;
    }
}
