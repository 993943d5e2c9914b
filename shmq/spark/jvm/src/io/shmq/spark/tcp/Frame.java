package io.shmq.spark.tcp;

/** One frame off the wire: its header fields and its payload bytes (a msgpack map; empty = {}). */
public final class Frame {
    public final int type;
    public final int version;
    public final int status;
    public final int msgId;
    public final byte[] payload;

    public Frame(int type, int version, int status, int msgId, byte[] payload) {
        this.type = type;
        this.version = version;
        this.status = status;
        this.msgId = msgId;
        this.payload = payload;
    }

    public boolean isReply() {
        return (type & Wire.REPLY_BIT) != 0;
    }

    /** A reader of the payload from its start. */
    public MsgpackReader reader() {
        return new MsgpackReader(payload, 0, payload.length);
    }

    @Override
    public String toString() {
        return String.format("Frame(type=0x%02X, status=%s, msgId=%d, %d bytes)", type, Wire.statusName(status), msgId,
                payload.length);
    }
}
