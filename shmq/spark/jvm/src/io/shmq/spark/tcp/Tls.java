package io.shmq.spark.tcp;

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.CertPathBuilderException;
import java.security.cert.CertPathValidatorException;
import java.security.cert.Certificate;
import java.security.cert.CertificateException;
import java.security.cert.CertificateFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLSocketFactory;
import javax.net.ssl.TrustManagerFactory;

/**
 * The sockets a {@code tcps://} connection uses, trusting what the Python client trusts: only the CA
 * certificates (PEM) of {@code $SHMQ_TLS_CA} when it is set (or the system property {@code shmq.tls.ca}),
 * else the JVM's own CAs. The server's name is checked against its certificate. Client certificates
 * (a server with --tls-client-ca) are not supported here.
 */
public final class Tls {
    public static final String CA_ENV = "SHMQ_TLS_CA";
    public static final String CA_PROPERTY = "shmq.tls.ca";

    private Tls() {
    }

    /** The CA file named by the system property or $SHMQ_TLS_CA, or null. */
    public static String caFile() {
        String ca = System.getProperty(CA_PROPERTY);
        if (ca == null || ca.isEmpty()) {
            ca = System.getenv(CA_ENV);
        }
        return ca == null || ca.isEmpty() ? null : ca;
    }

    /** A socket factory trusting the CAs of {@code caFile} (PEM), or the JVM's CAs when null. */
    public static SSLSocketFactory factory(String caFile) throws IOException {
        if (caFile == null) {
            return (SSLSocketFactory) SSLSocketFactory.getDefault();
        }
        try (InputStream in = new FileInputStream(caFile)) {
            KeyStore trusted = KeyStore.getInstance(KeyStore.getDefaultType());
            trusted.load(null, null);
            int i = 0;
            for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                trusted.setCertificateEntry("ca" + i++, c);
            }
            if (i == 0) {
                throw new IOException("$" + CA_ENV + " " + caFile + ": no CA certificate in it");
            }
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(trusted);
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(null, tmf.getTrustManagers(), null);
            return ctx.getSocketFactory();
        } catch (GeneralSecurityException e) {
            throw new IOException("$" + CA_ENV + " " + caFile + ": no CA certificate (" + e.getMessage() + ")", e);
        }
    }

    /** A failed handshake in words: an untrusted certificate says what is trusted, and how to trust another CA. */
    static String reason(SSLException e) {
        String cert = null;
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof CertPathBuilderException || t instanceof CertPathValidatorException) {
                String ca = caFile();
                return "certificate verify failed: no CA trusted here signed the server's certificate ("
                        + (ca == null ? "the JVM's CAs are: set $" + CA_ENV + " to the server's CA file"
                        : "only those of $" + CA_ENV + " " + ca + " are") + ")";
            }
            if (t instanceof CertificateException && cert == null) {
                cert = "certificate verify failed: " + t.getMessage();
            }
        }
        return cert != null ? cert : e.getMessage();
    }
}
