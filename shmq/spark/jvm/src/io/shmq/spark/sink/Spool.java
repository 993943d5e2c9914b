package io.shmq.spark.sink;

import org.apache.spark.sql.connector.write.WriterCommitMessage;

import java.io.File;
import java.util.ArrayList;
import java.util.List;

/** What one task spooled: its rows in an Arrow IPC file of /dev/shm (a task's commit message to the driver). */
final class Spool implements WriterCommitMessage {
    private static final long serialVersionUID = 1L;
    final String path;
    final int task;
    final long rows;

    Spool(String path, int task, long rows) {
        this.path = path;
        this.task = task;
        this.rows = rows;
    }

    /** The spools among a commit's messages (a task that failed sends none). */
    static List<Spool> of(WriterCommitMessage[] messages) {
        List<Spool> out = new ArrayList<>();
        if (messages != null) {
            for (WriterCommitMessage m : messages) {
                if (m instanceof Spool) {
                    out.add((Spool) m);
                }
            }
        }
        return out;
    }

    static void delete(List<Spool> spools) {
        for (Spool s : spools) {
            new File(s.path).delete();
        }
    }
}
