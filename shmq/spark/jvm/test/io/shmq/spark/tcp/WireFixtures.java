package io.shmq.spark.tcp;

import static io.shmq.spark.tcp.TcpCheck.*;

import io.shmq.spark.source.RecordBlock;
import java.net.ProtocolException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;

/**
 * This client's codec against bytes the Python codec made (tests/spark/test_jvm_tcp.py writes them to args[0]):
 * requests.txt ("kind args... hex" a line) must be what this side builds, byte for byte; replies.bin (reply frames
 * back to back) is decoded fed a byte at a time and fed whole, alike, and printed for the Python test to compare.
 */
public final class WireFixtures {
    private static final HexFormat HEX = HexFormat.of();

    public static void main(String[] args) throws Exception {
        Path dir = Path.of(args[0]);
        for (String line : Files.readAllLines(dir.resolve("requests.txt"))) {
            String[] f = line.split(" ");
            MsgpackWriter w;
            int type;
            switch (f[0]) {
                case "hello":
                    type = Wire.HELLO;
                    w = StreamMessages.hello(f[1], f[2].equals("-") ? null : f[2]);
                    break;
                case "info":
                    type = Wire.STREAM_INFO;
                    w = StreamMessages.streamInfo(f[1]);
                    break;
                case "offsets":
                    type = Wire.OFFSETS;
                    w = StreamMessages.offsets(f[1], Integer.parseInt(f[2]));
                    break;
                case "read":
                    type = Wire.READ;
                    w = StreamMessages.read(f[1], Integer.parseInt(f[2]), Long.parseLong(f[3]), Integer.parseInt(f[4]));
                    break;
                default:
                    throw new AssertionError("unknown request kind " + f[0]);
            }
            int msgId = type == Wire.HELLO ? Wire.HELLO_MSG_ID : 7;
            equal(f[f.length - 1], HEX.formatHex(Wire.request(type, msgId, w)), "request " + line);
        }
        byte[] replies = Files.readAllBytes(dir.resolve("replies.bin"));
        String byteByByte = decode(replies, 1), whole = decode(replies, replies.length);
        equal(whole, byteByByte, "fed a byte at a time, as fed whole");
        System.out.print(whole);
    }

    /** The reply frames of {@code bytes}, fed {@code step} bytes at a time, as text. */
    private static String decode(byte[] bytes, int step) throws ProtocolException {
        FrameDecoder d = new FrameDecoder(Wire.DEFAULT_MAX_FRAME_BYTES);
        StringBuilder out = new StringBuilder();
        int at = 0;
        while (at < bytes.length) {
            at += d.feed(bytes, at, Math.min(step, bytes.length - at));
            Frame f = d.next();
            if (f == null) {
                continue;
            }
            out.append(String.format("frame %02x %d %d%n", f.type, f.msgId, f.status));
            if (f.status != Wire.OK) {
                ServerException e = StreamMessages.error(f, "server");
                out.append("error ").append(Wire.statusName(e.status())).append(' ').append(e.earliest()).append(' ')
                        .append(e.end()).append(' ').append(e.serverMessage()).append('\n');
            } else if (f.type == (Wire.REPLY_BIT | Wire.STREAM_INFO)) {
                out.append("partitions ").append(StreamMessages.partitions(f)).append('\n');
            } else if (f.type == (Wire.REPLY_BIT | Wire.OFFSETS)) {
                long[] o = StreamMessages.offsets(f);
                out.append("offsets ").append(o[0]).append(' ').append(o[1]).append('\n');
            } else if (f.type == (Wire.REPLY_BIT | Wire.HELLO)) {
                out.append("max_frame_bytes ").append(StreamMessages.maxFrameBytes(f)).append('\n');
            } else if (f.type == (Wire.REPLY_BIT | Wire.READ)) {
                RecordBlock b = new RecordBlock();
                StreamMessages.records(f, Long.MAX_VALUE, Integer.MAX_VALUE, b);
                for (int i = 0; i < b.count; i++) {
                    out.append("record ").append(line(b, i)).append('\n');
                }
            }
        }
        if (d.wanted() != Wire.HEADER_SIZE) {
            throw new AssertionError("replies.bin ends inside a frame");
        }
        return out.toString();
    }
}
