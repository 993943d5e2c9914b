package io.shmq.spark.tcp;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * Writes the few msgpack shapes a request needs (maps, arrays, str, int, float, bool, bin) into a growable buffer, in the
 * smallest form, as Python's msgpack packs them: a request built here is byte for byte the Python client's.
 */
public final class MsgpackWriter {
    private byte[] buf = new byte[64];
    private int len;

    /** The bytes written so far (a copy). */
    public byte[] toByteArray() {
        return Arrays.copyOf(buf, len);
    }

    public int size() {
        return len;
    }

    public MsgpackWriter map(int entries) {
        if (entries < 16) {
            return put(0x80 | entries);
        }
        return entries <= 0xFFFF ? put(0xDE).u16(entries) : put(0xDF).u32(entries);
    }

    public MsgpackWriter array(int items) {
        if (items < 16) {
            return put(0x90 | items);
        }
        return items <= 0xFFFF ? put(0xDC).u16(items) : put(0xDD).u32(items);
    }

    public MsgpackWriter float64(double v) {
        long bits = Double.doubleToRawLongBits(v);
        return put(0xCB).u32(bits >>> 32).u32(bits);
    }

    public MsgpackWriter str(String s) {
        byte[] b = s.getBytes(StandardCharsets.UTF_8);
        int n = b.length;
        if (n < 32) {
            put(0xA0 | n);
        } else if (n <= 0xFF) {
            put(0xD9).put(n);
        } else if (n <= 0xFFFF) {
            put(0xDA).u16(n);
        } else {
            put(0xDB).u32(n);
        }
        return raw(b, 0, n);
    }

    public MsgpackWriter bin(byte[] b) {
        int n = b.length;
        if (n <= 0xFF) {
            put(0xC4).put(n);
        } else if (n <= 0xFFFF) {
            put(0xC5).u16(n);
        } else {
            put(0xC6).u32(n);
        }
        return raw(b, 0, n);
    }

    public MsgpackWriter bool(boolean v) {
        return put(v ? 0xC3 : 0xC2);
    }

    /** An integer in its smallest form (positive ones unsigned, negative ones signed). */
    public MsgpackWriter integer(long v) {
        if (v >= 0) {
            if (v < 128) {
                return put((int) v);
            } else if (v <= 0xFF) {
                return put(0xCC).put((int) v);
            } else if (v <= 0xFFFF) {
                return put(0xCD).u16((int) v);
            } else if (v <= 0xFFFFFFFFL) {
                return put(0xCE).u32(v);
            }
            return put(0xCF).u32(v >>> 32).u32(v);
        }
        if (v >= -32) {
            return put((int) v & 0xFF);
        } else if (v >= Byte.MIN_VALUE) {
            return put(0xD0).put((int) v & 0xFF);
        } else if (v >= Short.MIN_VALUE) {
            return put(0xD1).u16((int) v);
        } else if (v >= Integer.MIN_VALUE) {
            return put(0xD2).u32(v);
        }
        return put(0xD3).u32(v >>> 32).u32(v);
    }

    private MsgpackWriter u16(int v) {
        return put(v >>> 8).put(v);
    }

    private MsgpackWriter u32(long v) {
        return put((int) (v >>> 24)).put((int) (v >>> 16)).put((int) (v >>> 8)).put((int) v);
    }

    private MsgpackWriter put(int b) {
        room(1);
        buf[len++] = (byte) b;
        return this;
    }

    private MsgpackWriter raw(byte[] b, int off, int n) {
        room(n);
        System.arraycopy(b, off, buf, len, n);
        len += n;
        return this;
    }

    private void room(int n) {
        if (len + n > buf.length) {
            buf = Arrays.copyOf(buf, Math.max(buf.length * 2, len + n));
        }
    }
}
