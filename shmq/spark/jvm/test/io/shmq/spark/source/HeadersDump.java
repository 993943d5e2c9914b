package io.shmq.spark.source;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

import static io.shmq.spark.source.SourceCheck.*;

/**
 * Headers.decode: args[0] is a file of hex-encoded stored headers, one a line (the Python engine's
 * encoding); prints each decoded map or list of pairs as "key=value" pairs in hex of their UTF-8 ("-"
 * for a null value), comma-separated, for the Python test to compare with the Python source's
 * rendering. Malformed bytes must be refused.
 */
public final class HeadersDump {
    public static void main(String[] args) throws Exception {
        HexFormat hex = HexFormat.of();
        for (String line : Files.readAllLines(Paths.get(args[0]))) {
            byte[] raw = hex.parseHex(line.trim());
            byte[] padded = new byte[raw.length + 3]; // at an offset inside a larger arena, as in a RecordBlock
            System.arraycopy(raw, 0, padded, 2, raw.length);
            List<Map.Entry<String, String>> m = Headers.decode(padded, 2, raw.length);
            StringBuilder s = new StringBuilder();
            for (Map.Entry<String, String> e : m) {
                if (s.length() > 0) {
                    s.append(',');
                }
                s.append(hex.formatHex(e.getKey().getBytes(StandardCharsets.UTF_8))).append('=')
                        .append(e.getValue() == null ? "-" : hex.formatHex(e.getValue().getBytes(StandardCharsets.UTF_8)));
            }
            System.out.println(s);
        }
        equal(0, Headers.decode(new byte[0], 0, 0).size(), "no bytes: no headers");
        raises(IllegalArgumentException.class, "not a map", () -> Headers.decode(new byte[] {(byte) 0xc3}, 0, 1));
        raises(IllegalArgumentException.class, "not a [key, value] pair",
                () -> Headers.decode(new byte[] {(byte) 0x91, (byte) 0x91, (byte) 0xa1, 'k'}, 0, 4));
        raises(IllegalArgumentException.class, "bytes after the array",
                () -> Headers.decode(new byte[] {(byte) 0x90, 0}, 0, 2));
        raises(IllegalArgumentException.class, "cut short",
                () -> Headers.decode(new byte[] {(byte) 0x81, (byte) 0xa1, 'k', (byte) 0xa3, 'v'}, 0, 5));
        raises(IllegalArgumentException.class, "a key that is not a str",
                () -> Headers.decode(new byte[] {(byte) 0x81, 1, 2}, 0, 3));
        raises(IllegalArgumentException.class, "bytes after the map",
                () -> Headers.decode(new byte[] {(byte) 0x80, 0}, 0, 2));
        raises(IllegalArgumentException.class, "outside the data", () -> Headers.decode(new byte[2], 1, 2));
    }
}
