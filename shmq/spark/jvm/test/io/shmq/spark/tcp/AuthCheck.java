package io.shmq.spark.tcp;

import java.net.InetAddress;

/**
 * {@link Auth#discover} for tests/spark/test_jvm_tcp.py, held to shmq.auth.discover's answers: arguments
 * PORT/LOCAL/PEER (the server's port, the addresses of both ends); prints the run directory, then a line each: the
 * token found and where, or "-".
 */
public final class AuthCheck {
    public static void main(String[] args) throws Exception {
        System.out.println("run " + Auth.runDir());
        for (String arg : args) {
            String[] at = arg.split("/", 3);
            Auth.Found found = Auth.discover(InetAddress.getByName(at[1]), InetAddress.getByName(at[2]),
                    Integer.parseInt(at[0]));
            System.out.println(found.token == null ? "-" : found.token + " " + found.source);
        }
    }
}
