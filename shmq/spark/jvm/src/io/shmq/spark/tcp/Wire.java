package io.shmq.spark.tcp;

/**
 * The DEADBEEF protocol's constants (docs/PROTOCOL.md) and the one place a frame header is packed: a 16-byte
 * header (magic, payload length, type, version, status, msg id; big-endian) and a msgpack map.
 */
public final class Wire {
    public static final int MAGIC = 0xDEADBEEF;
    public static final int VERSION = 1;
    public static final int HEADER_SIZE = 16;
    public static final int REPLY_BIT = 0x80;
    /** The server's default max_frame_bytes; its HELLO reply tells its own. */
    public static final int DEFAULT_MAX_FRAME_BYTES = 16 << 20;
    /** HELLO's msg id, as the Python client sends it: the header then ends in CR LF, so a line-reading peer
     *  (an HTTP server) answers at once. */
    public static final int HELLO_MSG_ID = 0x0D0A;

    // request types used here
    public static final int HELLO = 0x01;
    public static final int STREAM_INFO = 0x23;
    public static final int READ = 0x2A;
    public static final int OFFSETS = 0x2B;

    // status codes read by this client
    public static final int OK = 0;
    public static final int UNAUTHORIZED = 3;
    public static final int TOO_LARGE = 7;
    public static final int LIMIT_EXCEEDED = 13;
    public static final int STREAM_NOT_FOUND = 14;
    public static final int OFFSET_OUT_OF_RANGE = 16;

    private static final String[] STATUS_NAMES = new String[67];

    static {
        String[] low = {"OK", "BAD_FRAME", "BAD_REQUEST", "UNAUTHORIZED", "NO_SUCH_QUEUE", "QUEUE_EXISTS",
            "QUEUE_FULL", "TOO_LARGE", "UNKNOWN_DELIVERY", "UNSUPPORTED_VERSION", "INTERNAL", "STORAGE",
            "LOCK_TIMEOUT", "LIMIT_EXCEEDED", "STREAM_NOT_FOUND", "STREAM_EXISTS", "OFFSET_OUT_OF_RANGE",
            "COMMIT_FAILED"};
        System.arraycopy(low, 0, STATUS_NAMES, 0, low.length);
        STATUS_NAMES[64] = "EXCHANGE_NOT_FOUND";
        STATUS_NAMES[65] = "EXCHANGE_EXISTS";
        STATUS_NAMES[66] = "REQUEST_TIMEOUT";
    }

    private Wire() {
    }

    /** A status code's name (Status in shmq/protocol/frames.py), or "status N". */
    public static String statusName(int status) {
        String name = status >= 0 && status < STATUS_NAMES.length ? STATUS_NAMES[status] : null;
        return name != null ? name : "status " + status;
    }

    /** A request frame: header + the msgpack payload (an empty map travels as 0 bytes, as the Python codec sends it). */
    public static byte[] request(int type, int msgId, MsgpackWriter payload) {
        byte[] body = payload == null || isEmptyMap(payload) ? new byte[0] : payload.toByteArray();
        byte[] frame = new byte[HEADER_SIZE + body.length];
        putInt(frame, 0, MAGIC);
        putInt(frame, 4, body.length);
        frame[8] = (byte) type;
        frame[9] = (byte) VERSION;
        frame[10] = 0;
        frame[11] = 0;
        putInt(frame, 12, msgId);
        System.arraycopy(body, 0, frame, HEADER_SIZE, body.length);
        return frame;
    }

    private static boolean isEmptyMap(MsgpackWriter payload) {
        return payload.size() == 1 && (payload.toByteArray()[0] & 0xFF) == 0x80;
    }

    static int getInt(byte[] b, int at) {
        return ((b[at] & 0xFF) << 24) | ((b[at + 1] & 0xFF) << 16) | ((b[at + 2] & 0xFF) << 8) | (b[at + 3] & 0xFF);
    }

    private static void putInt(byte[] b, int at, int v) {
        b[at] = (byte) (v >>> 24);
        b[at + 1] = (byte) (v >>> 16);
        b[at + 2] = (byte) (v >>> 8);
        b[at + 3] = (byte) v;
    }
}
