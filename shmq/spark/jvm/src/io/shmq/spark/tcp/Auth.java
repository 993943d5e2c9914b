package io.shmq.spark.tcp;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.File;
import java.io.IOException;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.HashSet;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * How a client finds the token it shows a shmq server: the client side of shmq/auth.py, rule for rule, and its
 * one owner in the JVM (every connection of the connector opens through {@link Connection#open}). The token given
 * (the token option), else the url's, else $SHMQ_TOKEN, else the token of this user's live server at the address
 * reached: the runtime file {@code run/server-PORT-PID.json} in shmq's per-user directory ($SHMQ_HOME, else
 * $XDG_STATE_HOME/shmq, else ~/.local/state/shmq) that a server with a token writes, used only if the server that
 * wrote it still runs (the same pid and start time) and the peer reached is an address it bound (or, reached on
 * this host, it bound every address). So the token never goes to another user's server or to another host.
 */
public final class Auth {
    public static final String TOKEN_ENV = "SHMQ_TOKEN";
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Pattern IPV4 = Pattern.compile("(0|[1-9][0-9]{0,2})(\\.(0|[1-9][0-9]{0,2})){3}");
    private static final Pattern IPV6 = Pattern.compile("[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*");

    private Auth() {
    }

    /** A token and where it came from, for messages ("the token given", "the token in FILE"); null: none found. */
    public static final class Found {
        public final String token;
        public final String source;

        Found(String token, String source) {
            this.token = token;
            this.source = source;
        }
    }

    /**
     * The token to show the server at {@code peer} (port {@code port}), reached from {@code local}: {@code given},
     * else the url's, else $SHMQ_TOKEN, else this user's live server's ({@link #discover}); else none (a null token).
     */
    public static Found clientToken(String given, Endpoint endpoint, InetAddress local, InetAddress peer, int port) {
        if (given != null) {
            return new Found(given, "the token given");
        }
        if (endpoint.token != null) {
            return new Found(endpoint.token, "the token in the url");
        }
        String env = System.getenv(TOKEN_ENV);
        if (env != null && !env.isEmpty()) {
            return new Found(env, "the token in $" + TOKEN_ENV);
        }
        return discover(local, peer, port);
    }

    /** The per-user directory: $SHMQ_HOME, else $XDG_STATE_HOME/shmq, else ~/.local/state/shmq (auth.home). */
    public static Path home() {
        String shmqHome = System.getenv("SHMQ_HOME");
        if (shmqHome != null && !shmqHome.isEmpty()) {
            return Paths.get(shmqHome).toAbsolutePath().normalize();
        }
        String state = System.getenv("XDG_STATE_HOME");
        if (state == null || !new File(state).isAbsolute()) { // the XDG spec: relative values are ignored
            String user = System.getenv("HOME") != null ? System.getenv("HOME") : System.getProperty("user.home");
            return Paths.get(user, ".local", "state", "shmq");
        }
        return Paths.get(state, "shmq");
    }

    /** Where running servers advertise themselves to their user's clients. */
    public static Path runDir() {
        return home().resolve("run");
    }

    /**
     * The token of this user's live server at {@code peer}, reached from {@code local}, and the runtime file that
     * holds it; a null token if there is none (auth.discover).
     */
    public static Found discover(InetAddress local, InetAddress peer, int port) {
        File[] files = runDir().toFile().listFiles(
                f -> f.getName().startsWith("server-" + port + "-") && f.getName().endsWith(".json"));
        if (files == null || peer == null) {
            return new Found(null, "");
        }
        Arrays.sort(files);
        for (File f : files) {
            JsonNode info;
            try {
                info = JSON.readTree(f);
            } catch (IOException | RuntimeException e) {
                continue; // being written, or not ours to read: as if absent
            }
            if (info != null && info.isObject() && info.path("port").isIntegralNumber()
                    && info.path("port").asLong() == port && info.path("token").isTextual() && alive(info)
                    && serves(info, peer, local)) {
                return new Found(info.path("token").asText(), "the token in " + f.getPath());
            }
        }
        return new Found(null, "");
    }

    /** Whether the server that wrote {@code info} still runs: its pid's start time is the one written. */
    static boolean alive(JsonNode info) {
        JsonNode pid = info.path("pid"), start = info.path("start");
        if (!pid.isIntegralNumber() || pid.asLong() <= 0 || !start.isIntegralNumber()) {
            return false;
        }
        Long ticks = startTicks(pid.asLong());
        return ticks != null && ticks == start.asLong();
    }

    /** The process' start time (clock ticks since boot, field 22 of /proc/PID/stat), or null if it is gone. */
    static Long startTicks(long pid) {
        try {
            String stat = new String(Files.readAllBytes(Paths.get("/proc", Long.toString(pid), "stat")),
                    StandardCharsets.ISO_8859_1);
            String[] fields = stat.substring(stat.lastIndexOf(')') + 2).trim().split("\\s+"); // fields 1-2 end at ')'
            return Long.parseLong(fields[19]);
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    /** Whether the server of {@code info} is the one at {@code peer}, reached from {@code local} (auth._serves). */
    static boolean serves(JsonNode info, InetAddress peer, InetAddress local) {
        Set<InetAddress> bound = new HashSet<>();
        for (JsonNode a : info.path("addresses")) {
            InetAddress ip = ip(a.asText());
            if (ip == null) {
                return false;
            }
            bound.add(ip);
        }
        if (bound.contains(peer)) {
            return true;
        }
        boolean onThisHost = peer.isLoopbackAddress() || peer.equals(local);
        return onThisHost && bound.stream().anyMatch(InetAddress::isAnyLocalAddress);
    }

    /** An IP address written as Python's ipaddress reads it (no host name, a scope cut off); null for anything else. */
    static InetAddress ip(String text) {
        String s = text.split("%", 2)[0];
        try {
            if (IPV4.matcher(s).matches()) {
                byte[] b = new byte[4];
                String[] parts = s.split("\\.");
                for (int i = 0; i < 4; i++) {
                    int v = Integer.parseInt(parts[i]);
                    if (v > 255) {
                        return null;
                    }
                    b[i] = (byte) v;
                }
                return InetAddress.getByAddress(b);
            }
            // with a colon, a literal: parsed, never looked up (an IPv4-mapped one comes as IPv4); else no address
            return IPV6.matcher(s).matches() ? InetAddress.getByName(s) : null;
        } catch (UnknownHostException e) {
            return null;
        }
    }
}
