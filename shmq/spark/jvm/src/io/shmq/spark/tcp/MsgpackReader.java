package io.shmq.spark.tcp;

import java.net.ProtocolException;
import java.nio.charset.StandardCharsets;

/**
 * Reads msgpack values in place from a byte array: a cursor, no object per value. It reads what a reply
 * holds (maps, arrays, str, ints, floats, bool, nil, bin) and skips anything else whole; every length is
 * checked against the bytes there, so bad input raises ProtocolException, never anything else.
 */
public final class MsgpackReader {
    private static final int MAX_DEPTH = 64;
    private final byte[] buf;
    private final int limit;
    private int pos;
    private int binStart;

    public MsgpackReader(byte[] buf, int offset, int length) {
        if (offset < 0 || length < 0 || offset + length > buf.length) {
            throw new IndexOutOfBoundsException("offset " + offset + " length " + length + " of " + buf.length);
        }
        this.buf = buf;
        this.pos = offset;
        this.limit = offset + length;
    }

    public int position() {
        return pos;
    }

    public boolean atEnd() {
        return pos >= limit;
    }

    /** Where the bytes of the last {@link #bin()} start in the array. */
    public int binStart() {
        return binStart;
    }

    /** The number of entries of the map that comes next. */
    public int mapHeader() throws ProtocolException {
        int b = peek();
        if ((b & 0xF0) == 0x80) {
            pos++;
            return b & 0x0F;
        } else if (b == 0xDE) {
            pos++;
            return u16();
        } else if (b == 0xDF) {
            pos++;
            return count(u32());
        }
        throw wrong("a map", b);
    }

    /** The number of items of the array that comes next. */
    public int arrayHeader() throws ProtocolException {
        int b = peek();
        if ((b & 0xF0) == 0x90) {
            pos++;
            return b & 0x0F;
        } else if (b == 0xDC) {
            pos++;
            return u16();
        } else if (b == 0xDD) {
            pos++;
            return count(u32());
        }
        throw wrong("an array", b);
    }

    /** Whether a nil comes next (consumed if so). */
    public boolean nil() throws ProtocolException {
        if (peek() == 0xC0) {
            pos++;
            return true;
        }
        return false;
    }

    public boolean bool() throws ProtocolException {
        int b = peek();
        if (b == 0xC2 || b == 0xC3) {
            pos++;
            return b == 0xC3;
        }
        throw wrong("a bool", b);
    }

    public String str() throws ProtocolException {
        int n = strLength();
        String s = new String(buf, pos, n, StandardCharsets.UTF_8);
        pos += n;
        return s;
    }

    /** Reads a str and returns the index of the entry of {@code keys} (UTF-8) it equals, or -1. */
    public int key(byte[][] keys) throws ProtocolException {
        int n = strLength();
        int at = pos;
        pos += n;
        outer:
        for (int k = 0; k < keys.length; k++) {
            byte[] key = keys[k];
            if (key.length != n) {
                continue;
            }
            for (int i = 0; i < n; i++) {
                if (buf[at + i] != key[i]) {
                    continue outer;
                }
            }
            return k;
        }
        return -1;
    }

    /** A bin's length; its bytes start at {@link #binStart()}. */
    public int bin() throws ProtocolException {
        int b = peek();
        int n;
        if (b == 0xC4) {
            pos++;
            n = u8();
        } else if (b == 0xC5) {
            pos++;
            n = u16();
        } else if (b == 0xC6) {
            pos++;
            n = count(u32());
        } else {
            throw wrong("bin", b);
        }
        need(n);
        binStart = pos;
        pos += n;
        return n;
    }

    /** An integer that fits a signed 64-bit long. */
    public long integer() throws ProtocolException {
        int b = peek();
        if (b < 0x80) {
            pos++;
            return b;
        } else if (b >= 0xE0) {
            pos++;
            return (byte) b;
        }
        switch (b) {
            case 0xCC: pos++; return u8();
            case 0xCD: pos++; return u16();
            case 0xCE: pos++; return u32();
            case 0xCF: {
                pos++;
                long v = u64();
                if (v < 0) {
                    throw new ProtocolException("msgpack integer " + Long.toUnsignedString(v) + " does not fit 64 signed bits");
                }
                return v;
            }
            case 0xD0: pos++; return (byte) u8();
            case 0xD1: pos++; return (short) u16();
            case 0xD2: pos++; return (int) u32();
            case 0xD3: pos++; return u64();
            default: throw wrong("an integer", b);
        }
    }

    /** A float (or an integer) as a double. */
    public double number() throws ProtocolException {
        int b = peek();
        if (b == 0xCB) {
            pos++;
            return Double.longBitsToDouble(u64());
        } else if (b == 0xCA) {
            pos++;
            return Float.intBitsToFloat((int) u32());
        }
        return integer();
    }

    /** Skips one value, whatever it is (containers whole, up to 64 deep). */
    public void skip() throws ProtocolException {
        skip(0);
    }

    private void skip(int depth) throws ProtocolException {
        if (depth > MAX_DEPTH) {
            throw new ProtocolException("msgpack nested more than " + MAX_DEPTH + " deep");
        }
        int b = peek();
        if (b < 0x80 || b >= 0xE0 || b == 0xC0 || b == 0xC2 || b == 0xC3) {
            pos++;
        } else if ((b & 0xF0) == 0x80 || b == 0xDE || b == 0xDF) {
            long n = 2L * mapHeader();
            for (long i = 0; i < n; i++) {
                skip(depth + 1);
            }
        } else if ((b & 0xF0) == 0x90 || b == 0xDC || b == 0xDD) {
            int n = arrayHeader();
            for (int i = 0; i < n; i++) {
                skip(depth + 1);
            }
        } else if ((b & 0xE0) == 0xA0 || (b >= 0xD9 && b <= 0xDB)) {
            int n = strLength(); // (not pos += strLength(): that adds to pos as it was before the header)
            pos += n;
        } else if (b >= 0xC4 && b <= 0xC6) {
            bin();
        } else if (b >= 0xCC && b <= 0xD3) { // uint/int 8..64: 1, 2, 4, 8 bytes (a uint64 past Long.MAX_VALUE too)
            int n = 1 << ((b - 0xCC) & 3);
            need(1L + n);
            pos += 1 + n;
        } else if (b == 0xCA || b == 0xCB) {
            number();
        } else if (b >= 0xD4 && b <= 0xD8) { // fixext: type byte + 1, 2, 4, 8, 16 bytes
            pos++;
            int n = 1 + (1 << (b - 0xD4));
            need(n);
            pos += n;
        } else if (b >= 0xC7 && b <= 0xC9) { // ext 8/16/32: length, type byte, data
            pos++;
            int n = b == 0xC7 ? u8() : b == 0xC8 ? u16() : count(u32());
            need(1 + (long) n);
            pos += 1 + n;
        } else {
            throw new ProtocolException(String.format("malformed msgpack: byte 0x%02X is no type", b));
        }
    }

    private int strLength() throws ProtocolException {
        int b = peek();
        int n;
        if ((b & 0xE0) == 0xA0) {
            pos++;
            n = b & 0x1F;
        } else if (b == 0xD9) {
            pos++;
            n = u8();
        } else if (b == 0xDA) {
            pos++;
            n = u16();
        } else if (b == 0xDB) {
            pos++;
            n = count(u32());
        } else {
            throw wrong("a str", b);
        }
        need(n);
        return n;
    }

    private int peek() throws ProtocolException {
        need(1);
        return buf[pos] & 0xFF;
    }

    private void need(long n) throws ProtocolException {
        if (n > limit - pos) {
            throw new ProtocolException("malformed msgpack: a value runs " + (n - (limit - pos)) + " bytes past the end");
        }
    }

    private int u8() throws ProtocolException {
        need(1);
        return buf[pos++] & 0xFF;
    }

    private int u16() throws ProtocolException {
        need(2);
        int v = ((buf[pos] & 0xFF) << 8) | (buf[pos + 1] & 0xFF);
        pos += 2;
        return v;
    }

    private long u32() throws ProtocolException {
        need(4);
        long v = ((long) (buf[pos] & 0xFF) << 24) | ((buf[pos + 1] & 0xFF) << 16) | ((buf[pos + 2] & 0xFF) << 8)
                | (buf[pos + 3] & 0xFF);
        pos += 4;
        return v;
    }

    private long u64() throws ProtocolException {
        return (u32() << 32) | u32();
    }

    private int count(long n) throws ProtocolException {
        if (n > limit - pos) { // every item takes at least one byte
            throw new ProtocolException("malformed msgpack: a length of " + n + " runs past the end");
        }
        return (int) n;
    }

    private static ProtocolException wrong(String expected, int b) {
        return new ProtocolException(String.format("malformed reply: expected %s, found msgpack byte 0x%02X", expected, b));
    }
}
