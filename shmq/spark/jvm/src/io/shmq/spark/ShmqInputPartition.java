package io.shmq.spark;

import org.apache.spark.sql.connector.read.InputPartition;

import java.util.List;

/** One Spark partition: one or more offset ranges, read one after the other. */
final class ShmqInputPartition implements InputPartition {
    private static final long serialVersionUID = 1L;
    final Plan.Range[] ranges;

    ShmqInputPartition(List<Plan.Range> ranges) {
        this.ranges = ranges.toArray(new Plan.Range[0]);
    }
}
