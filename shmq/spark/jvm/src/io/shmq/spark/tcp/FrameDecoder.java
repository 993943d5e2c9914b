package io.shmq.spark.tcp;

import java.net.ProtocolException;

/**
 * Bytes in ({@link #feed}), frames out ({@link #next}): sans-IO, it owns no socket, so a test feeds it one byte at a
 * time. Strategy: the 16-byte header is gathered first and checked (magic, then length against max_frame_bytes,
 * then version) before a byte of payload is taken; then one array of exactly the declared length is filled, which
 * becomes the frame's payload without another copy. A bad header fails the decoder for good (the stream has lost
 * its frame boundaries, or was no shmq server's): its ProtocolException is raised again by every later call.
 */
public final class FrameDecoder {
    private final int maxFrameBytes;
    private final byte[] header = new byte[Wire.HEADER_SIZE];
    private int headerFill;
    private byte[] payload; // the frame being filled, once its header is in
    private int payloadFill;
    private Frame ready;
    private ProtocolException failed;

    public FrameDecoder(int maxFrameBytes) {
        if (maxFrameBytes < 0) {
            throw new IllegalArgumentException("maxFrameBytes must be >= 0, not " + maxFrameBytes);
        }
        this.maxFrameBytes = maxFrameBytes;
    }

    /** How many more bytes the frame in progress needs (at least 1): a socket loop reads no more than this. */
    public int wanted() {
        return payload == null ? Wire.HEADER_SIZE - headerFill : payload.length - payloadFill;
    }

    /**
     * Takes up to {@code len} bytes and returns how many it took: it stops at the end of a frame, which
     * {@link #next} then returns (feed the rest after). Raises ProtocolException for a header it refuses.
     */
    public int feed(byte[] b, int off, int len) throws ProtocolException {
        if (failed != null) {
            throw failed;
        }
        int taken = 0;
        while (taken < len && ready == null) {
            if (payload == null) {
                int n = Math.min(Wire.HEADER_SIZE - headerFill, len - taken);
                System.arraycopy(b, off + taken, header, headerFill, n);
                headerFill += n;
                taken += n;
                if (headerFill == Wire.HEADER_SIZE) {
                    payload = new byte[checkedLength()];
                    payloadFill = 0;
                    completeIfFull();
                }
            } else {
                int n = Math.min(payload.length - payloadFill, len - taken);
                System.arraycopy(b, off + taken, payload, payloadFill, n);
                payloadFill += n;
                taken += n;
                completeIfFull();
            }
        }
        return taken;
    }

    /** The frame completed by the last feed, or null while more bytes are needed. */
    public Frame next() throws ProtocolException {
        if (failed != null) {
            throw failed;
        }
        Frame f = ready;
        ready = null;
        return f;
    }

    private void completeIfFull() {
        if (payloadFill == payload.length) {
            ready = new Frame(header[8] & 0xFF, header[9] & 0xFF, ((header[10] & 0xFF) << 8) | (header[11] & 0xFF),
                    Wire.getInt(header, 12), payload);
            payload = null;
            headerFill = 0;
        }
    }

    private int checkedLength() throws ProtocolException {
        int magic = Wire.getInt(header, 0);
        long length = Wire.getInt(header, 4) & 0xFFFFFFFFL;
        int version = header[9] & 0xFF;
        if (magic != Wire.MAGIC) {
            throw fail(String.format("bad magic 0x%08X (expected 0x%08X)", magic, Wire.MAGIC));
        }
        if (length > maxFrameBytes) {
            throw fail("frame payload of " + length + " bytes exceeds max_frame_bytes=" + maxFrameBytes);
        }
        if (version != Wire.VERSION) { // a server never answers in another version: nothing to resync for
            throw fail("unsupported protocol version " + version + " (this side speaks " + Wire.VERSION + ")");
        }
        return (int) length;
    }

    private ProtocolException fail(String message) {
        failed = new ProtocolException(message);
        return failed;
    }
}
