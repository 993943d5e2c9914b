package io.shmq.spark.source;

import io.shmq.spark.shm.Layout;
import io.shmq.spark.shm.Partition;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;

/**
 * A stream read straight from its /dev/shm segments, mapped read-only, without the lock
 * (docs/FORMAT.md, "Reading a partition without the lock"). Offsets only in a "wal" stream's logs
 * on disk throw {@link io.shmq.spark.shm.OnDiskException}: read those another way.
 */
public final class ShmStream implements RecordSource {
    private static final Pattern NAMESPACE = Pattern.compile("[A-Za-z0-9_-]{1,40}");
    private static final Pattern NAME = Pattern.compile("[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}");
    private static final Path SHM_DIR = Paths.get("/dev/shm");
    /** A shared mapping no reader asked for in this long is let go (ns). */
    static final long IDLE_NS = TimeUnit.SECONDS.toNanos(60);
    private static final ConcurrentHashMap<String, Shared> SHARED = new ConcurrentHashMap<>();

    private final String name;
    private final Partition[] parts;
    private final boolean logged;
    private final Path[] files;  // the meta segment, then the partitions'
    private final Object[] fileKeys;  // theirs when mapped (device and inode)

    private ShmStream(String name, Partition[] parts, boolean logged, Path[] files, Object[] fileKeys) {
        this.name = name;
        this.parts = parts;
        this.logged = logged;
        this.files = files;
        this.fileKeys = fileKeys;
    }

    /**
     * The stream's segments as mapped for every reader in this JVM (the driver, an executor's tasks), mapped at the
     * first call and again once they are not the files in /dev/shm any more (the stream was deleted, or its namespace
     * destroyed, and maybe made again); FileNotFoundException when they are not on this host. A task then maps
     * nothing, and finds the pages it reads already in its page tables after the ring's first lap. Mappings unused
     * for {@link #IDLE_NS}, or stale, are let go (the JVM unmaps them when it collects them, as any mapping).
     */
    public static ShmStream shared(String namespace, String stream) throws IOException {
        String key = namespace + "/" + stream;
        long now = System.nanoTime();
        Shared s = SHARED.get(key);
        if (s == null || s.stream.stale()) {
            s = new Shared(open(namespace, stream));
            SHARED.put(key, s);  // two tasks racing here map twice at most: the last one stays
            Janitor.start();
        }
        s.used = now;
        return s.stream;
    }

    /** Lets go of the shared mappings unused for IDLE_NS and of the stale ones; their number left. */
    static int sweep() {
        long now = System.nanoTime();
        SHARED.entrySet().removeIf(e -> now - e.getValue().used > IDLE_NS || e.getValue().stream.stale());
        return SHARED.size();
    }

    /** A shared mapping and when a reader last asked for it (System.nanoTime()). */
    private static final class Shared {
        final ShmStream stream;
        volatile long used;

        Shared(ShmStream stream) {
            this.stream = stream;
        }
    }

    /** Sweeps the shared mappings every few seconds, from the first one on (a daemon thread). */
    private static final class Janitor {
        static {
            ScheduledExecutorService ex = Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "shmq-mappings");
                t.setDaemon(true);
                return t;
            });
            ex.scheduleWithFixedDelay(ShmStream::sweep, 10, 10, TimeUnit.SECONDS);
        }

        static void start() {
            // the class's initializer, once
        }
    }

    /**
     * The mapped segments are not the stream's any more: deleted (any partition's flag: deletion sets them all), no
     * longer the files of their names (a destroyed namespace's are unlinked without the flag), or fewer than its
     * partitions (it grew since: add_partitions, Kafka's CreatePartitions). A mapped file's inode stays in use while
     * mapped, so a file made since under its name has another.
     */
    boolean stale() {
        for (Partition p : parts) {
            if (p.deleted()) {
                return true;
            }
        }
        try {
            for (int i = 0; i < files.length; i++) {
                if (!Objects.equals(fileKeys[i], fileKey(files[i], null))) {
                    return true;
                }
            }
            if ((staticHeader(files[0], name).getShort(Layout.STREAM_PARTITIONS_OFF) & 0xFFFF) != parts.length) {
                return true;  // grown: the partition count is published last, once the new partitions exist
            }
        } catch (IOException e) {
            return true;  // gone: the next open says so
        }
        return false;
    }

    /** The file's device and inode; FileNotFoundException({@code missing}) when there is none. */
    private static Object fileKey(Path path, String missing) throws IOException {
        try {
            return Files.readAttributes(path, BasicFileAttributes.class).fileKey();
        } catch (NoSuchFileException e) {
            throw new FileNotFoundException(missing);
        }
    }

    /** Maps the stream's partition segments read-only; FileNotFoundException when they are not on this host. */
    public static ShmStream open(String namespace, String stream) throws IOException {
        if (namespace == null || !NAMESPACE.matcher(namespace).matches()) {
            throw new IllegalArgumentException("invalid namespace " + namespace + ": use 1-40 of A-Z a-z 0-9 _ -");
        }
        if (stream == null || !NAME.matcher(stream).matches()) {
            throw new IllegalArgumentException("invalid stream name " + stream
                    + ": use 1-128 of A-Z a-z 0-9 _ . : - (not starting with . : -)");
        }
        String base = "shmq." + namespace + ".s." + stream;
        String what = "stream '" + stream + "' in namespace '" + namespace + "'";
        // each file's key is taken before it is mapped: one replaced in between leaves a stale mapping, seen as such
        Path meta = SHM_DIR.resolve(base);
        Object metaKey = fileKey(meta, "no " + what + " in shared memory on this host (" + meta + ")");
        ByteBuffer head = staticHeader(meta, what);
        int n = head.getShort(Layout.STREAM_PARTITIONS_OFF) & 0xFFFF;
        Partition[] parts = new Partition[n];
        Path[] files = new Path[n + 1];
        Object[] keys = new Object[n + 1];
        files[0] = meta;
        keys[0] = metaKey;
        for (int p = 0; p < n; p++) {
            String part = "stream '" + stream + "' partition " + p;
            files[p + 1] = SHM_DIR.resolve(base + "#" + p);
            keys[p + 1] = fileKey(files[p + 1], part + " is not in shared memory on this host (" + files[p + 1] + ")");
            parts[p] = Partition.open(files[p + 1], part);
        }
        return new ShmStream(stream, parts, head.get(Layout.STREAM_DURABILITY_OFF) == Layout.DURABILITY_WAL, files,
                keys);
    }

    /** The meta segment's static header, checked (magic, layout version). */
    private static ByteBuffer staticHeader(Path meta, String what) throws IOException {
        ByteBuffer head = ByteBuffer.allocate(Layout.STREAM_STATIC_SIZE).order(ByteOrder.LITTLE_ENDIAN);
        try (FileChannel ch = FileChannel.open(meta, StandardOpenOption.READ)) {
            while (head.hasRemaining() && ch.read(head, head.position()) > 0) {
                // read the static header whole
            }
        } catch (NoSuchFileException e) {
            throw new FileNotFoundException("no " + what + " in shared memory on this host (" + meta + ")");
        }
        int version = head.getShort(4) & 0xFFFF;
        if (head.hasRemaining() || head.getInt(0) != Layout.STREAM_MAGIC) {
            throw new IOException(what + " is not ready (being created?)");
        }
        if (version != Layout.STREAM_VERSION) {
            throw new IOException(what + " was made by another shmq version (layout " + version + ", this reader knows "
                    + Layout.STREAM_VERSION + ")");
        }
        return head;
    }

    /** A "wal" stream: its older records may be only in the logs on disk, which this reader does not read. */
    public boolean logged() {
        return logged;
    }

    /** The stream's name. */
    public String name() {
        return name;
    }

    private Partition part(int partition) {
        if (partition < 0 || partition >= parts.length) {
            throw new IllegalArgumentException("stream '" + name + "' has partitions 0.." + (parts.length - 1)
                    + ", not " + partition);
        }
        return parts[partition];
    }

    @Override
    public int partitions() {
        return parts.length;
    }

    /** The oldest readable offset, as the Python source says: for a "wal" stream, possibly on disk only. */
    @Override
    public long earliest(int partition) throws IOException {
        return part(partition).earliest();
    }

    /** The oldest offset shared memory holds: from there on, {@link #read} reads. */
    public long memoryEarliest(int partition) throws IOException {
        return part(partition).memoryEarliest();
    }

    @Override
    public long latest(int partition) throws IOException {
        return part(partition).latest();
    }

    @Override
    public int read(int partition, long from, long until, int maxRecords, RecordBlock out) throws IOException {
        return part(partition).read(from, until, maxRecords, out);
    }

    /** Copies, over all partitions, that found their records overwritten by appends and were made again. */
    public long retries() {
        long n = 0;
        for (Partition p : parts) {
            n += p.retries();
        }
        return n;
    }

    /** The mappings go when this object is collected; nothing else is held. */
    @Override
    public void close() {
    }
}
