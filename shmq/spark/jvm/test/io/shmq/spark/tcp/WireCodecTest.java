package io.shmq.spark.tcp;

import static io.shmq.spark.tcp.TcpCheck.*;

import io.shmq.spark.source.RecordBlock;
import java.net.ProtocolException;
import java.util.Arrays;
import java.util.HexFormat;

/** The sans-IO pieces on their own: msgpack both ways, frames fed a byte at a time, bad input refused, urls. */
public final class WireCodecTest {
    private static final HexFormat HEX = HexFormat.of();

    public static void main(String[] args) throws Exception {
        msgpackRoundTrips();
        framesFedByteByByte();
        badFramesFail();
        malformedPayloadsFail();
        readReplyIntoBlock();
        nanosFromSeconds();
        urls();
        System.out.println("WireCodecTest: ok");
    }

    static void msgpackRoundTrips() throws Exception {
        long[] ints = {0, 1, 127, 128, 255, 256, 65535, 65536, 0xFFFFFFFFL, 0x100000000L, Long.MAX_VALUE, -1, -32, -33,
            -128, -129, -32768, -32769, Integer.MIN_VALUE, Integer.MIN_VALUE - 1L, Long.MIN_VALUE};
        String[] strs = {"", "a", "x".repeat(31), "x".repeat(32), "y".repeat(255), "z".repeat(256), "é".repeat(40000)};
        MsgpackWriter w = new MsgpackWriter().map(ints.length + strs.length + 3);
        for (long v : ints) {
            w.str("i").integer(v);
        }
        for (String s : strs) {
            w.str("s").str(s);
        }
        byte[] big = new byte[70000];
        big[69999] = 9;
        w.str("b0").bin(new byte[0]).str("b1").bin(new byte[300]).str("b2").bin(big);
        byte[] bytes = w.toByteArray();
        MsgpackReader r = new MsgpackReader(bytes, 0, bytes.length);
        equal(ints.length + strs.length + 3, r.mapHeader(), "map size");
        for (long v : ints) {
            equal("i", r.str(), "key");
            equal(v, r.integer(), "integer " + v);
        }
        for (String s : strs) {
            equal("s", r.str(), "key");
            equal(s, r.str(), "str of " + s.length());
        }
        r.str();
        equal(0, r.bin(), "empty bin");
        r.str();
        equal(300, r.bin(), "bin8+ length");
        r.str();
        equal(70000, r.bin(), "bin32 length");
        equal((byte) 9, bytes[r.binStart() + 69999], "bin32 content");
        equal(true, r.atEnd(), "all read");
        r = new MsgpackReader(bytes, 0, bytes.length);
        r.skip();
        equal(true, r.atEnd(), "skip takes the whole map");
        // the smallest forms, as Python's msgpack packs them
        equal("cc80", HEX.formatHex(new MsgpackWriter().integer(128).toByteArray()), "uint8");
        equal("d0df", HEX.formatHex(new MsgpackWriter().integer(-33).toByteArray()), "int8");
        equal("a3616263", HEX.formatHex(new MsgpackWriter().str("abc").toByteArray()), "fixstr");
        // other shapes a reply may hold are read or skipped whole: float32/64, nil, bools, ext, arrays
        byte[] other = HEX.parseHex("95ca3fc00000cb400c000000000000c0c3d7010000000000000000" + "c70201ffff");
        r = new MsgpackReader(other, 0, other.length);
        equal(5, r.arrayHeader(), "array");
        equal(1.5, r.number(), "float32");
        equal(3.5, r.number(), "float64");
        equal(true, r.nil(), "nil");
        equal(true, r.bool(), "true");
        r.skip();
        equal(false, r.atEnd(), "the fixext was skipped, not more");
        r.skip();
        equal(true, r.atEnd(), "ext8 skipped");
        raises(ProtocolException.class, "does not fit 64 signed bits",
                () -> new MsgpackReader(HEX.parseHex("cfffffffffffffffff"), 0, 9).integer());
    }

    static void framesFedByteByByte() throws Exception {
        byte[] a = Wire.request(Wire.READ, 7, StreamMessages.read("s", 1, 300, 10));
        byte[] b = Wire.request(Wire.OFFSETS | Wire.REPLY_BIT, 8, null);
        byte[] both = Arrays.copyOf(a, a.length + b.length);
        System.arraycopy(b, 0, both, a.length, b.length);
        FrameDecoder d = new FrameDecoder(1 << 20);
        Frame[] got = new Frame[2];
        int n = 0;
        for (int i = 0; i < both.length; i++) {
            equal(1, d.feed(both, i, 1), "one byte taken");
            Frame f = d.next();
            if (f != null) {
                got[n++] = f;
            }
        }
        equal(2, n, "two frames");
        equal(Wire.READ, got[0].type, "type");
        equal(7, got[0].msgId, "msg id");
        equal(a.length - Wire.HEADER_SIZE, got[0].payload.length, "payload length");
        equal(0x80 | Wire.OFFSETS, got[1].type, "reply type");
        equal(0, got[1].payload.length, "an empty map travels as no bytes");
        equal(null, d.next(), "nothing more");
        // fed whole: the decoder stops at the end of the first frame
        d = new FrameDecoder(1 << 20);
        equal(a.length, d.feed(both, 0, both.length), "a feed stops at a frame's end");
        equal(7, d.next().msgId, "first");
        equal(b.length, d.feed(both, a.length, b.length), "the rest");
        equal(8, d.next().msgId, "second");
    }

    static void badFramesFail() throws Exception {
        byte[] frame = Wire.request(0x07 /* PING */, 1, new MsgpackWriter().map(1).str("k").integer(1));
        byte[] bad = frame.clone();
        bad[0] = 0x48; // "HTTP/1.1 ..." from a peer that is no shmq server
        FrameDecoder d = new FrameDecoder(1 << 20);
        raises(ProtocolException.class, "bad magic 0x48ADBEEF", () -> d.feed(bad, 0, bad.length));
        raises(ProtocolException.class, "bad magic", () -> d.next()); // failed for good
        FrameDecoder small = new FrameDecoder(3);
        raises(ProtocolException.class, "frame payload of 4 bytes exceeds max_frame_bytes=3",
                () -> small.feed(frame, 0, frame.length));
        byte[] v2 = frame.clone();
        v2[9] = 2;
        raises(ProtocolException.class, "unsupported protocol version 2",
                () -> new FrameDecoder(100).feed(v2, 0, v2.length));
    }

    static void malformedPayloadsFail() throws Exception {
        String[] bad = {"81", "81a1", "81a16bc5ff", "dfffffffff", "81a1", "c1", "91d9ff"};
        for (String h : bad) {
            byte[] p = HEX.parseHex(h);
            Frame f = new Frame(0x80 | Wire.READ, 1, 0, 1, p);
            raises(ProtocolException.class, "malformed", () -> StreamMessages.records(f, Long.MAX_VALUE, 10, new RecordBlock()));
        }
        Frame noValue = new Frame(0x80 | Wire.READ, 1, 0, 1, HEX.parseHex("81a77265636f7264739181a66f666673657405"));
        raises(ProtocolException.class, "lacks 'offset', 'value' or 'timestamp'",
                () -> StreamMessages.records(noValue, Long.MAX_VALUE, 10, new RecordBlock()));
        Frame noParts = new Frame(0x80 | Wire.STREAM_INFO, 1, 0, 1, new byte[0]);
        raises(ProtocolException.class, "without a valid 'partitions'", () -> StreamMessages.partitions(noParts));
    }

    static void readReplyIntoBlock() throws Exception {
        MsgpackWriter w = new MsgpackWriter().map(2).str("other").integer(1).str("records").array(3);
        for (int i = 0; i < 3; i++) {
            w.map(i == 1 ? 6 : 4).str("partition").integer(0).str("offset").integer(10 + i).str("value").bin(new byte[] {(byte) i});
            if (i == 1) {
                w.str("key").bin(new byte[] {7, 7}).str("headers").map(1).str("h").str("v");
            }
            w.str("timestamp").float64(1.5 + i);
        }
        byte[] p = w.toByteArray();
        RecordBlock out = new RecordBlock();
        Frame f = new Frame(0x80 | Wire.READ, 1, 0, 1, p);
        equal(2, StreamMessages.records(f, 12, 10, out), "records below until");
        equal(2, out.count, "count");
        equal(10L, out.offset[0], "offset 0");
        equal(-1, out.keyLen[0], "no key");
        equal(0, out.headersLen[0], "no headers");
        equal(1_500_000_000L, out.timestampNs[0], "ns");
        equal("0707", HEX.formatHex(out.data, out.keyStart[1], out.keyStart[1] + out.keyLen[1]), "key");
        equal("81a168a176", HEX.formatHex(out.data, out.headersStart[1], out.headersStart[1] + out.headersLen[1]), "headers raw");
        equal("01", HEX.formatHex(out.data, out.valueStart[1], out.valueStart[1] + out.valueLen[1]), "value");
        out.clear();
        equal(1, StreamMessages.records(f, 100, 1, out), "at most max");
    }

    static void nanosFromSeconds() {
        equal(1_700_000_000_500_000_000L, StreamMessages.nanos(1_700_000_000.5), "whole seconds and fraction");
        long ns = 1_763_950_000_987_654_321L;
        long back = StreamMessages.nanos(ns / 1e9);
        if (Math.abs(back - ns) > 250) {
            throw new AssertionError("nanos(" + ns + " / 1e9) = " + back + ": more than 250 ns off");
        }
        equal(-1_500_000_000L, StreamMessages.nanos(-1.5), "before 1970");
    }

    static void urls() {
        Endpoint e = Endpoint.parse("tcp://127.0.0.1:7000");
        equal("127.0.0.1", e.host, "host");
        equal(7000, e.port, "port");
        equal(false, e.tls, "plain");
        equal(null, e.token, "no token");
        e = Endpoint.parse("tcps://:s3cret@example.com?token=s3cret");
        equal(Endpoint.DEFAULT_PORT, e.port, "default port");
        equal(true, e.tls, "tls");
        equal("s3cret", e.token, "token");
        equal("tcps://example.com", e.url, "the url without its token");
        e = Endpoint.parse("tcp://[::1]:7001");
        equal("::1", e.host, "ipv6 host");
        raises(IllegalArgumentException.class, "unsupported broker url 'http://***@h:1'",
                () -> Endpoint.parse("http://:tok@h:1"));
        raises(IllegalArgumentException.class, "unknown parameter 'x'", () -> Endpoint.parse("tcp://h:1?x=***"));
        raises(IllegalArgumentException.class, "gives two different tokens", () -> Endpoint.parse("tcp://:a@h:1?token=b"));
        raises(IllegalArgumentException.class, "put the token after a colon", () -> Endpoint.parse("tcp://tok@h:1"));
    }
}
