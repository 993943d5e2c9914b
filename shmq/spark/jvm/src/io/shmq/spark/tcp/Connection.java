package io.shmq.spark.tcp;

import java.io.BufferedInputStream;
import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ProtocolException;
import java.net.Socket;
import java.net.SocketTimeoutException;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

/**
 * One blocking connection to a shmq server: the socket loop around {@link FrameDecoder} and
 * {@link StreamMessages}. It connects, says HELLO with the token, then sends one request at a time and reads
 * until its reply. Socket failures become IOExceptions naming the endpoint; error replies ServerExceptions.
 * Not thread-safe: one caller at a time.
 */
public final class Connection implements Closeable {
    public static final String CLIENT = "shmq-jvm";
    public static final String TOKEN_ENV = Auth.TOKEN_ENV;
    public static final int CONNECT_TIMEOUT_MS = 10_000;
    public static final int REPLY_TIMEOUT_MS = 120_000;
    private static final int HELLO_REPLY_LIMIT = 64 << 10;

    private final Endpoint endpoint;
    private final Socket socket;
    private final InputStream in;
    private final OutputStream out;
    private final byte[] chunk = new byte[1 << 16];
    /** Before the HELLO reply a peer (perhaps no shmq server) gets little room; then what its max_frame_bytes says. */
    private FrameDecoder decoder = new FrameDecoder(HELLO_REPLY_LIMIT);
    private int lastId;
    private boolean closed;

    private Connection(Endpoint endpoint, Socket socket) throws IOException {
        this.endpoint = endpoint;
        this.socket = socket;
        this.in = new BufferedInputStream(socket.getInputStream(), 1 << 16);
        this.out = socket.getOutputStream();
    }

    /**
     * Connects to {@code endpoint} and says HELLO with {@code token} (null: the url's, else $SHMQ_TOKEN, else the
     * one this user's server there advertises, else none: {@link Auth}). IOException if the server cannot be
     * reached; ServerException (UNAUTHORIZED) if it refuses the token.
     */
    public static Connection open(Endpoint endpoint, String token) throws IOException {
        String source;
        Socket s = null;
        Connection c = null;
        try {
            s = new Socket();
            s.connect(new InetSocketAddress(endpoint.host, endpoint.port), CONNECT_TIMEOUT_MS);
            s.setTcpNoDelay(true);
            Auth.Found found = Auth.clientToken(token, endpoint, s.getLocalAddress(), s.getInetAddress(), s.getPort());
            token = found.token;
            source = found.source;
            s.setSoTimeout(CONNECT_TIMEOUT_MS); // the HELLO's limit too
            if (endpoint.tls) {
                SSLSocket tls = (SSLSocket) Tls.factory(Tls.caFile()).createSocket(s, endpoint.host, endpoint.port, true);
                SSLParameters params = tls.getSSLParameters();
                params.setEndpointIdentificationAlgorithm("HTTPS");
                tls.setSSLParameters(params);
                tls.startHandshake();
                s = tls;
            }
            c = new Connection(endpoint, s);
        } catch (SSLException e) {
            close(s);
            throw new IOException("cannot connect to " + endpoint + ": TLS " + Tls.reason(e), e);
        } catch (IOException e) {
            close(s);
            throw new IOException("cannot connect to " + endpoint + ": " + e.getMessage(), e);
        }
        try {
            Frame hello = c.call(Wire.HELLO, StreamMessages.hello(CLIENT, token), Wire.HELLO_MSG_ID);
            // a reply may pass max_frame_bytes by a record (the first always comes): room for twice that
            long limit = Math.max(2L * StreamMessages.maxFrameBytes(hello), Wire.DEFAULT_MAX_FRAME_BYTES);
            c.decoder = new FrameDecoder((int) Math.min(limit, Integer.MAX_VALUE - 8));
            s.setSoTimeout(REPLY_TIMEOUT_MS);
        } catch (ServerException e) {
            c.close();
            if (e.status() != Wire.UNAUTHORIZED) {
                throw e;
            }
            String who = token == null
                    ? endpoint + " requires a token and none was found: pass one (the token option, "
                    + "tcp://:TOKEN@host:port) or set $" + TOKEN_ENV + ", or run the query as the server's user on its "
                    + "host (it reads " + Auth.runDir() + ")"
                    : endpoint + " refused " + source;
            throw new ServerException(who, e.status(), e.serverMessage(), -1, -1);
        } catch (ProtocolException e) {
            c.close();
            throw e;
        } catch (IOException e) {
            c.close();
            String hint = endpoint.tls
                    ? " (at the HELLO, over TLS: a server with --tls-client-ca closes connections that show no client "
                    + "certificate its CA signed, and this client shows none)"
                    : " (a server with --tls-cert closes plain connections at the HELLO: use tcps://)";
            boolean dropped = !(e.getCause() instanceof SocketTimeoutException);
            throw new IOException(e.getMessage() + (dropped ? hint : ""), e);
        }
        return c;
    }

    public Endpoint endpoint() {
        return endpoint;
    }

    /** Sends a request and returns its OK reply; ServerException for an error reply. */
    public Frame call(int type, MsgpackWriter payload) throws IOException {
        lastId = lastId % 0x7FFFFFFF + 1;
        if (lastId == Wire.HELLO_MSG_ID) {
            lastId++;
        }
        return call(type, payload, lastId);
    }

    private Frame call(int type, MsgpackWriter payload, int msgId) throws IOException {
        if (closed) {
            throw new IOException(endpoint + ": the connection is closed");
        }
        try {
            out.write(Wire.request(type, msgId, payload));
            out.flush();
            while (true) {
                Frame f = nextFrame();
                if (f.msgId == msgId) {
                    if (f.status != Wire.OK) {
                        throw StreamMessages.error(f, endpoint.toString());
                    }
                    if (f.type != (type | Wire.REPLY_BIT)) {
                        throw new ProtocolException(String.format("a reply of type 0x%02X to a request of type 0x%02X",
                                f.type, type));
                    }
                    return f;
                }
                if (f.msgId == 0 && f.status != Wire.OK) { // the server speaks for the whole connection, then closes
                    close();
                    throw StreamMessages.error(f, endpoint.toString());
                }
                // anything else (a push) is not this request's: dropped
            }
        } catch (SocketTimeoutException e) {
            int waited = socket.getSoTimeout() / 1000;
            close();
            throw new IOException(endpoint + ": no reply within " + waited + "s", e);
        } catch (ProtocolException e) {
            close();
            throw new ProtocolException(endpoint + " sent what is no shmq reply: " + e.getMessage());
        } catch (ServerException e) {
            throw e;
        } catch (EOFException e) {
            close();
            throw e;
        } catch (IOException e) {
            close();
            throw new IOException(endpoint + ": " + e.getMessage(), e);
        }
    }

    private Frame nextFrame() throws IOException {
        while (true) {
            Frame f = decoder.next();
            if (f != null) {
                return f;
            }
            int n = in.read(chunk, 0, Math.min(chunk.length, decoder.wanted()));
            if (n < 0) {
                throw new EOFException(endpoint + ": connection closed by the server");
            }
            decoder.feed(chunk, 0, n);
        }
    }

    public boolean isClosed() {
        return closed;
    }

    @Override
    public void close() {
        closed = true;
        close(socket);
    }

    private static void close(Socket s) {
        if (s != null) {
            try {
                s.close();
            } catch (IOException ignored) {
                // closing: nothing more to do
            }
        }
    }
}
