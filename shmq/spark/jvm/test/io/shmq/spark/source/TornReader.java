package io.shmq.spark.source;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.zip.CRC32;

/**
 * Reads partition 0 of a stream that a Python process appends to as fast as it can, with
 * retention drop, until it reads the writer's last record (value "END") or args[2] seconds pass.
 * Every record checks itself: its value is the 8-byte offset, a CRC-32 of the offset's bytes, the
 * key, the headers and the rest of the value, then the rest; the key is the offset in decimal and the
 * header "o" too. One loop in four reads on from where it was, the others from the current earliest (the
 * records about to be overwritten). Prints "reading" once it has the stream open, and at the end
 * "verified N torn T stale S retries R losses L moved M end true|false"; exits 1 if any record was
 * torn or stale.
 */
public final class TornReader {
    public static void main(String[] args) throws Exception {
        String ns = args[0], name = args[1];
        long deadline = System.nanoTime() + Long.parseLong(args[2]) * 1_000_000_000L;
        long verified = 0, torn = 0, stale = 0, losses = 0, loops = 0;
        long firstEarliest = -1, lastEarliest = -1;
        boolean end = false;
        RecordBlock out = new RecordBlock();
        try (ShmStream s = ShmStream.open(ns, name)) {
            long pos = s.earliest(0);
            firstEarliest = pos;
            System.out.println("reading");
            System.out.flush();
            while (!end && System.nanoTime() < deadline) {
                long from = (loops++ & 3) == 0 ? pos : s.earliest(0);
                int n;
                try {
                    n = s.read(0, from, Long.MAX_VALUE, 1000, out);
                } catch (DataLossException e) {
                    losses++;
                    pos = Math.max(pos, e.firstAvailable());
                    continue;
                }
                for (int i = 0; i < n; i++) {
                    int v = out.valueStart[i], vl = out.valueLen[i];
                    if (vl == 3 && new String(out.data, v, 3, StandardCharsets.US_ASCII).equals("END")) {
                        end = true;
                        continue;
                    }
                    String bad = check(out, i);
                    if (bad != null) {
                        if (bad.startsWith("stale")) {
                            stale++;
                        } else {
                            torn++;
                        }
                        if (torn + stale <= 5) {
                            System.err.println("record " + out.offset[i] + ": " + bad);
                        }
                    }
                    verified++;
                }
                if (n > 0) {
                    pos = Math.max(pos, out.offset[n - 1] + 1);
                }
                pos = Math.max(pos, out.next); // (past markers and aborted records, and compaction's gaps)
                lastEarliest = s.earliest(0);
            }
            System.out.println("verified " + verified + " torn " + torn + " stale " + stale + " retries " + s.retries()
                    + " losses " + losses + " moved " + (lastEarliest - firstEarliest) + " end " + end);
        }
        System.exit(torn + stale == 0 ? 0 : 1);
    }

    /** Why record i is not the whole record of its offset, or null when it is. */
    private static String check(RecordBlock b, int i) {
        long offset = b.offset[i];
        int v = b.valueStart[i], vl = b.valueLen[i];
        if (vl < 12 || b.keyLen[i] < 0) {
            return "torn: a value of " + vl + " bytes, key length " + b.keyLen[i];
        }
        ByteBuffer value = ByteBuffer.wrap(b.data, v, vl).order(ByteOrder.LITTLE_ENDIAN);
        long own = value.getLong(v);
        CRC32 crc = new CRC32();
        crc.update(b.data, v, 8);
        crc.update(b.data, b.keyStart[i], b.keyLen[i]);
        crc.update(b.data, b.headersStart[i], b.headersLen[i]);
        crc.update(b.data, v + 12, vl - 12);
        if ((int) crc.getValue() != value.getInt(v + 8)) {
            return "torn: its CRC does not match";
        }
        String key = new String(b.data, b.keyStart[i], b.keyLen[i], StandardCharsets.US_ASCII);
        Map<String, String> h = new HashMap<>();
        for (Map.Entry<String, String> e : Headers.decode(b.data, b.headersStart[i], b.headersLen[i])) {
            h.put(e.getKey(), e.getValue());
        }
        if (own != offset || !key.equals(Long.toString(offset)) || !Long.toString(offset).equals(h.get("o"))) {
            return "stale: it holds offset " + own + " (key " + key + ", header " + h.get("o") + ")";
        }
        return b.timestampNs[i] > 0 ? null : "torn: no timestamp";
    }
}
