package io.shmq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.sql.connector.read.streaming.ReadAllAvailable;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.ReadMinRows;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The JVM source's planning and option checks, driven line by line from stdin (one JSON request per line, one JSON
 * answer per line), so tests/spark/test_jvm_source.py holds them to the Python source's answers.
 */
public final class PlanTwin {
    private static final ObjectMapper JSON = new ObjectMapper();

    private PlanTwin() {
    }

    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        StringBuilder out = new StringBuilder();
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            JsonNode q = JSON.readTree(line);
            Object answer;
            try {
                answer = answer(q);
            } catch (IllegalArgumentException e) {
                answer = Map.of("error", e.getMessage());
            }
            out.append(JSON.writeValueAsString(answer)).append('\n');
        }
        System.out.print(out);
    }

    private static Object answer(JsonNode q) {
        switch (q.get("op").asText()) {
            case "share": {
                Map<Integer, Long> backlog = new TreeMap<>();
                for (Map.Entry<String, JsonNode> e : q.get("backlog").properties()) {
                    backlog.put(Integer.parseInt(e.getKey()), e.getValue().asLong());
                }
                return Plan.share(backlog, q.get("budget").asLong());
            }
            case "split":
                return rows(Plan.split(ranges(q.get("ranges")), q.get("n").isNull() ? null : q.get("n").asLong()));
            case "group": {
                List<Object> out = new ArrayList<>();
                for (List<Plan.Range> g : Plan.group(ranges(q.get("ranges")), q.get("n").isNull() ? null
                        : q.get("n").asLong())) {
                    out.add(rows(g));
                }
                return out;
            }
            case "json":
                return Plan.toJson(Plan.fromJson(q.get("offsets").asText()));
            case "options": {
                Map<String, String> given = new LinkedHashMap<>();
                q.get("options").properties().forEach(e -> given.put(e.getKey(), e.getValue().asText()));
                SourceOptions opts = new SourceOptions(given);
                if (q.get("part").asText().equals("batch")) {
                    new ShmqBatch(opts);
                } else {
                    ShmqMicroBatchStream s = new ShmqMicroBatchStream(opts);
                    ReadLimit l = s.getDefaultReadLimit();
                    return Map.of("limit", l instanceof ReadMaxRows ? "max " + ((ReadMaxRows) l).maxRows()
                            : l instanceof ReadMinRows ? "min " + ((ReadMinRows) l).minRows()
                            : l instanceof ReadAllAvailable ? "all" : l.toString());
                }
                return Map.of("ok", true);
            }
            default:
                throw new IllegalStateException("unknown op " + q);
        }
    }

    private static List<Plan.Range> ranges(JsonNode rows) {
        List<Plan.Range> out = new ArrayList<>();
        for (JsonNode r : rows) {
            out.add(new Plan.Range(r.get(0).asInt(), r.get(1).asLong(), r.get(2).asLong()));
        }
        return out;
    }

    private static List<long[]> rows(List<Plan.Range> ranges) {
        List<long[]> out = new ArrayList<>();
        for (Plan.Range r : ranges) {
            out.add(new long[]{r.partition, r.start, r.end});
        }
        return out;
    }
}
