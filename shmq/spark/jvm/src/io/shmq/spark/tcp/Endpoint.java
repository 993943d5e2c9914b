package io.shmq.spark.tcp;

import java.net.URI;
import java.net.URISyntaxException;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;

/**
 * A broker url taken apart as the Python client's split_url does: {@code tcp://[:TOKEN@]host[:port][?token=TOKEN]}
 * ({@code tcps://}: TLS), port 7878 by default. {@link #url} never holds the token, nor does an error about a url.
 */
public final class Endpoint {
    public static final int DEFAULT_PORT = 7878;
    public final String host;
    public final int port;
    public final boolean tls;
    /** The token the url carries, or null. */
    public final String token;
    /** The url without its token. */
    public final String url;
    /** host:port, as errors name it. */
    public final String where;

    private Endpoint(String host, int port, boolean tls, String token, String url, String where) {
        this.host = host;
        this.port = port;
        this.tls = tls;
        this.token = token;
        this.url = url;
        this.where = where;
    }

    /** Parses {@code url}; IllegalArgumentException in one line for anything else. */
    public static Endpoint parse(String url) {
        if (url == null) {
            throw new IllegalArgumentException("a broker url is needed: tcp://host:port (tcps://host:port: TLS)");
        }
        String shown = url.replaceAll("(//)[^/?#]*@", "$1***@").replaceAll("([?&][^=&#]*=)[^&#]*", "$1***");
        URI u;
        try {
            u = new URI(url);
        } catch (URISyntaxException e) {
            throw new IllegalArgumentException("unsupported broker url '" + shown + "': use tcp://host:port (tcps://host:port: TLS)");
        }
        String scheme = u.getScheme();
        if (!("tcp".equals(scheme) || "tcps".equals(scheme)) || u.getHost() == null) {
            throw new IllegalArgumentException("unsupported broker url '" + shown + "': use tcp://host:port (tcps://host:port: TLS)");
        }
        String token = null;
        String info = u.getRawUserInfo();
        if (info != null) {
            int colon = info.indexOf(':');
            if (colon < 0) {
                throw new IllegalArgumentException("broker url '" + shown + "': put the token after a colon, tcp://:TOKEN@host:port");
            }
            token = decode(info.substring(colon + 1));
        }
        String query = u.getRawQuery();
        if (query != null && !query.isEmpty()) {
            for (String part : query.split("&")) {
                int eq = part.indexOf('=');
                String name = eq < 0 ? part : part.substring(0, eq);
                if (!"token".equals(name)) {
                    throw new IllegalArgumentException("broker url '" + shown + "': unknown parameter '" + name + "' (a url takes only token=)");
                }
                String t = eq < 0 ? "" : decode(part.substring(eq + 1));
                if (token != null && !token.equals(t)) {
                    throw new IllegalArgumentException("broker url '" + shown + "' gives two different tokens");
                }
                token = t;
            }
        }
        if (token != null && (token.isEmpty() || token.chars().anyMatch(Character::isWhitespace))) {
            throw new IllegalArgumentException("broker url '" + shown + "': a token is not empty and has no spaces");
        }
        int port = u.getPort() < 0 ? DEFAULT_PORT : u.getPort();
        String host = u.getHost().startsWith("[") ? u.getHost().substring(1, u.getHost().length() - 1) : u.getHost();
        String authority = u.getHost() + (u.getPort() < 0 ? "" : ":" + u.getPort());
        return new Endpoint(host, port, "tcps".equals(scheme), token, scheme + "://" + authority,
                u.getHost() + ":" + port);
    }

    private static String decode(String s) {
        return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
    }

    @Override
    public String toString() {
        return where;
    }
}
