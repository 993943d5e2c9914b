package io.shmq.spark.source;

import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * Decodes a record's stored headers (a msgpack map of str keys, or a stream record's array of
 * [key, value] pairs: a key repeated, a nil value) into String to String pairs, in order, as the
 * Python source renders them (shmq/spark/arrow.py, header_map): str values as they are, bytes as
 * UTF-8 with bad bytes replaced, booleans "true"/"false", integers in decimal, floats as Python's
 * repr writes them, nil as null.
 */
public final class Headers {
    private Headers() {
    }

    /**
     * Decodes {@code len} bytes at {@code start} into (key, value or null) pairs; len 0 gives none.
     * IllegalArgumentException if malformed.
     */
    public static List<Map.Entry<String, String>> decode(byte[] data, int start, int len) {
        List<Map.Entry<String, String>> out = new ArrayList<>();
        if (len == 0) {
            return out;
        }
        if (start < 0 || len < 0 || start > data.length - len) {
            throw new IllegalArgumentException("headers: " + len + " bytes at " + start + " are outside the data");
        }
        Reader r = new Reader(data, start, start + len);
        int b = r.u8();
        long n;
        boolean pairs = false;
        if ((b & 0xF0) == 0x80) {
            n = b & 0x0F;
        } else if (b == 0xDE) {
            n = r.uint(2);
        } else if (b == 0xDF) {
            n = r.uint(4);
        } else if ((b & 0xF0) == 0x90 || b == 0xDC || b == 0xDD) { // an array of [key, value] pairs
            n = (b & 0xF0) == 0x90 ? b & 0x0F : r.uint(b == 0xDC ? 2 : 4);
            pairs = true;
        } else {
            throw r.bad("not a map (0x" + Integer.toHexString(b) + ")");
        }
        for (long i = 0; i < n; i++) {
            if (pairs && r.u8() != 0x92) {
                throw r.bad("an array item that is not a [key, value] pair");
            }
            String key = r.value(true);
            out.add(new AbstractMap.SimpleImmutableEntry<>(key, r.value(false)));
        }
        if (r.pos != r.end) {
            throw r.bad((r.end - r.pos) + " bytes after the " + (pairs ? "array" : "map"));
        }
        return out;
    }

    /** A cursor over msgpack bytes. */
    private static final class Reader {
        final byte[] data;
        int pos;
        final int end;

        Reader(byte[] data, int pos, int end) {
            this.data = data;
            this.pos = pos;
            this.end = end;
        }

        IllegalArgumentException bad(String why) {
            return new IllegalArgumentException("headers are not a msgpack map of str keys: " + why);
        }

        void need(long n) {
            if (n > end - pos) {
                throw bad("cut short");
            }
        }

        int u8() {
            need(1);
            return data[pos++] & 0xFF;
        }

        long uint(int size) {
            need(size);
            long v = 0;
            for (int i = 0; i < size; i++) {
                v = v << 8 | (data[pos++] & 0xFF);
            }
            return v;
        }

        String text(long n) {
            need(n);
            String s = new String(data, pos, (int) n, StandardCharsets.UTF_8);
            pos += (int) n;
            return s;
        }

        /** The next value rendered as the Python source does (nil: null); {@code key}: it must be a str. */
        String value(boolean key) {
            int b = u8();
            if ((b & 0xE0) == 0xA0) {
                return text(b & 0x1F);
            }
            if (b == 0xD9 || b == 0xDA || b == 0xDB) {
                return text(uint(1 << (b - 0xD9)));
            }
            if (key) {
                throw bad("a key that is not a str (0x" + Integer.toHexString(b) + ")");
            }
            if (b <= 0x7F) {
                return Integer.toString(b);
            }
            if (b >= 0xE0) {
                return Integer.toString((byte) b);
            }
            switch (b) {
                case 0xC2:
                    return "false";
                case 0xC3:
                    return "true";
                case 0xC0:
                    return null;
                case 0xC4:
                case 0xC5:
                case 0xC6:
                    return text(uint(1 << (b - 0xC4)));
                case 0xCC:
                case 0xCD:
                case 0xCE:
                    return Long.toString(uint(1 << (b - 0xCC)));
                case 0xCF:
                    return Long.toUnsignedString(uint(8));
                case 0xD0:
                    return Long.toString((byte) uint(1));
                case 0xD1:
                    return Long.toString((short) uint(2));
                case 0xD2:
                    return Long.toString((int) uint(4));
                case 0xD3:
                    return Long.toString(uint(8));
                case 0xCA:
                    return pythonRepr(Float.intBitsToFloat((int) uint(4)));
                case 0xCB:
                    return pythonRepr(Double.longBitsToDouble(uint(8)));
                default:
                    throw bad("a value of msgpack type 0x" + Integer.toHexString(b) + ", which headers never hold");
            }
        }
    }

    /** {@code repr(float)} of Python: the shortest digits that round-trip, exponent form below 1e-4 or from 1e16. */
    static String pythonRepr(double v) {
        if (Double.isNaN(v)) {
            return "nan";
        }
        if (Double.isInfinite(v)) {
            return v > 0 ? "inf" : "-inf";
        }
        if (v == 0) {
            return (1 / v < 0) ? "-0.0" : "0.0";
        }
        // Double.toString gives digits that round-trip; strip them to the shortest that still do
        BigDecimal d = new BigDecimal(Double.toString(Math.abs(v))).stripTrailingZeros();
        String digits = d.unscaledValue().toString();
        while (digits.length() > 1) { // JDK 17 sometimes gives one digit too many
            BigDecimal shorter = new BigDecimal(d.unscaledValue()).movePointLeft(d.scale())
                    .round(new java.math.MathContext(digits.length() - 1));
            if (shorter.doubleValue() != Math.abs(v)) {
                break;
            }
            d = shorter.stripTrailingZeros();
            digits = d.unscaledValue().toString();
        }
        int decpt = digits.length() - d.scale(); // value = 0.DIGITS x 10^decpt
        StringBuilder s = new StringBuilder(v < 0 ? "-" : "");
        if (decpt > 16 || decpt < -3) {
            s.append(digits.charAt(0));
            if (digits.length() > 1) {
                s.append('.').append(digits, 1, digits.length());
            }
            int e = decpt - 1;
            s.append(e < 0 ? "e-" : "e+");
            if (Math.abs(e) < 10) {
                s.append('0');
            }
            s.append(Math.abs(e));
        } else if (decpt <= 0) {
            s.append("0.");
            for (int i = decpt; i < 0; i++) {
                s.append('0');
            }
            s.append(digits);
        } else if (decpt >= digits.length()) {
            s.append(digits);
            for (int i = digits.length(); i < decpt; i++) {
                s.append('0');
            }
            s.append(".0");
        } else {
            s.append(digits, 0, decpt).append('.').append(digits, decpt, digits.length());
        }
        return s.toString();
    }
}
