"""Remote clients of ``shmq server`` (the TCP transport arrives with the server issue)."""
