package io.shmq.spark;

/** An option of the "shmq" source is missing or malformed: the one-line message of the Python source's SpecError. */
public final class ShmqSpecException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    public ShmqSpecException(String message) {
        super(message);
    }
}
