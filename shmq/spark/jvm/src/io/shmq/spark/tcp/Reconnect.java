package io.shmq.spark.tcp;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.io.Serializable;
import java.net.ProtocolException;
import java.net.SocketTimeoutException;
import java.security.cert.CertificateException;
import java.util.Locale;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Consumer;
import java.util.function.LongSupplier;

/**
 * Riding out a restart of the server a query reads over {@code url} (docs/SPARK.md, "When the server restarts"):
 * shmq/spark/outage.py's ride_out, rule for rule. A call that fails because the server cannot be reached (refused,
 * reset, closed, no reply), or that it refused for a limit ("the server is stopping", "too many connections"), is
 * made again: at once the first time (a connection the server closed while idle), then after pauses drawn between 0
 * and a bound that doubles from the first pause to at most the longest (full jitter, as the Python clients'
 * reconnect), until {@link #maxOutageS} seconds have passed since the first failure; then the last error, saying so.
 * Nothing else is tried again: another error reply (a refused token, no such stream), a peer that is no shmq server,
 * a certificate not trusted. Each JVM logs one warning per outage of a server, when the try made at once has failed
 * too. The defaults (option maxOutage's, and the pauses) are shmq/spark/options.py's, which shmq.spark.jar writes
 * into the jar as {@link #DEFAULTS}: defined once, in Python.
 */
public final class Reconnect implements Serializable {
    private static final long serialVersionUID = 1L;
    public static final String DEFAULTS = "/io/shmq/spark/defaults.properties";
    private static final Logger LOG = LoggerFactory.getLogger("shmq.spark");
    /** The servers (host:port) this JVM found unreachable, until one answers again: one warning per outage. */
    private static final Set<String> OUT = ConcurrentHashMap.newKeySet();
    // the tests' fake clock and log
    static LongSupplier nanos = System::nanoTime;
    static Sleeper sleeper = Thread::sleep;
    static Consumer<String> warn = LOG::warn;
    private static Properties defaults;

    public final double maxOutageS, firstPauseS, mostPauseS;

    public Reconnect(double maxOutageS, double firstPauseS, double mostPauseS) {
        this.maxOutageS = maxOutageS;
        this.firstPauseS = firstPauseS;
        this.mostPauseS = mostPauseS;
    }

    /** Riding out an outage for up to {@code maxOutageS} seconds, with the jar's pauses. */
    public static Reconnect of(double maxOutageS) {
        return new Reconnect(maxOutageS, defaultValue("reconnectFirstPause"), defaultValue("reconnectMostPause"));
    }

    /** Option maxOutage's default, in seconds (options.py's MAX_OUTAGE_S). */
    public static double defaultMaxOutage() {
        return defaultValue("maxOutage");
    }

    private static synchronized double defaultValue(String name) {
        if (defaults == null) {
            Properties p = new Properties();
            try (InputStream in = Reconnect.class.getResourceAsStream(DEFAULTS)) {
                if (in == null) {
                    throw new IllegalStateException("the shmq connector's classes come without " + DEFAULTS
                            + ": use the jar that shmq.spark.jar() builds");
                }
                p.load(in);
            } catch (IOException e) {
                throw new IllegalStateException("cannot read " + DEFAULTS + ": " + e.getMessage(), e);
            }
            defaults = p;
        }
        return Double.parseDouble(defaults.getProperty(name));
    }

    /** A call to the server, as {@link #call} makes it (again). */
    public interface Call<T> {
        T call() throws IOException;
    }

    /** Thread.sleep, or the tests' fake. */
    interface Sleeper {
        void sleep(long millis) throws InterruptedException;
    }

    /**
     * {@code call.call()}, made again while {@code endpoint} cannot be reached (see the class), {@code reset} run
     * after each failure (to drop a broken connection; may be null). {@code who} names the part in the log line.
     */
    public <T> T call(Endpoint endpoint, String who, Call<T> call, Runnable reset) throws IOException {
        int tries = 0;
        long started = 0;
        double pause = firstPauseS;
        while (true) {
            IOException error;
            try {
                T out = call.call();
                if (tries > 0) {
                    OUT.remove(endpoint.where);
                }
                return out;
            } catch (IOException e) {
                if (!unreachable(e)) {
                    throw e;
                }
                error = e;
                if (reset != null) {
                    reset.run();
                }
            }
            long now = nanos.getAsLong();
            tries++;
            if (tries == 1) {
                started = now;
                continue; // at once
            }
            double spent = (now - started) / 1e9;
            if (spent >= maxOutageS) {
                if (maxOutageS <= 0) {
                    throw error;
                }
                throw new IOException(error.getMessage() + " (the shmq " + who + " tried " + tries + " times in "
                        + String.format(Locale.ROOT, "%.0f", spent) + "s: option maxOutage is "
                        + seconds(maxOutageS) + "s)", error);
            }
            if (tries == 2 && OUT.add(endpoint.where)) {
                warn.accept("shmq " + who + ": the server at " + endpoint.url + " cannot be reached ("
                        + error.getMessage() + "); trying again for up to " + seconds(maxOutageS)
                        + "s (option maxOutage)");
            }
            double step = Math.min(pause, mostPauseS);
            pause = Math.min(pause * 2, mostPauseS);
            double wait = Math.min(ThreadLocalRandom.current().nextDouble(0, Math.nextUp(step)),
                    Math.max(0, maxOutageS - spent));
            try {
                sleeper.sleep((long) Math.ceil(wait * 1000));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                InterruptedIOException stopped = new InterruptedIOException("interrupted while waiting for "
                        + endpoint.url + " to come back: " + error.getMessage());
                stopped.initCause(error);
                throw stopped;
            }
        }
    }

    /**
     * Whether {@code e} says the server could not be reached (worth trying again): a failed connection, or a refusal
     * for a limit (LIMIT_EXCEEDED: a stopping server's, or its cap on connections, which every client that a restart
     * dropped meets at once; nothing was done). Not another error reply, not a peer that is no shmq server, not a
     * certificate that is not trusted (the same next time).
     */
    static boolean unreachable(IOException e) {
        if (e instanceof ServerException) {
            return ((ServerException) e).status() == Wire.LIMIT_EXCEEDED;
        }
        if (e instanceof ProtocolException
                || e instanceof InterruptedIOException && !(e instanceof SocketTimeoutException)) {
            return false;
        }
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof CertificateException || t instanceof ProtocolException) {
                return false;
            }
        }
        return true;
    }

    /** Seconds as Python's %g writes them (60, 2.5). */
    static String seconds(double s) {
        return s == Math.rint(s) && Math.abs(s) < 1e15 ? Long.toString((long) s) : Double.toString(s);
    }
}
