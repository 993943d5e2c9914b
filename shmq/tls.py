"""TLS for both ends: the server's context (``server_context``: ``--tls-cert``,
``--tls-key``, ``--tls-client-ca``), a client's (``client_context``: the one given, else
one from ``$SHMQ_TLS_CA`` / ``$SHMQ_TLS_CERT`` / ``$SHMQ_TLS_KEY``), and the one line a
failed handshake is told in (``describe``).

Strategy: the transports only wrap their sockets with the context chosen here, so the
blocking client, the asyncio client, the CLI, Spark and the job integrations trust the
same certificates from the same settings, and every certificate error reads alike.
"""

import functools
import os
import pwd
import re
import ssl

__all__ = ["server_context", "client_context", "describe", "note_refused", "readable_key_warning", "CA_ENV",
           "CERT_ENV", "KEY_ENV"]

CA_ENV, CERT_ENV, KEY_ENV = "SHMQ_TLS_CA", "SHMQ_TLS_CERT", "SHMQ_TLS_KEY"


def _NO_PASSWORD():  # an encrypted key fails in one line instead of prompting (a service has no terminal)
    return b""


def _reason(e: Exception) -> str:
    """An ssl or OS error in words, without its source position (``(_ssl.c:1006)``)."""
    if isinstance(e, ssl.SSLCertVerificationError) and e.verify_message:
        return f"certificate verify failed: {e.verify_message}"
    if isinstance(e, ssl.SSLError) and e.reason:
        return e.reason.lower().replace("_", " ")
    text = re.sub(r"^\[\w+\] |\s*\(_ssl\.c:\d+\)$", "", (e.strerror if isinstance(e, OSError) else None) or str(e))
    if text == "PEM lib":  # OpenSSL's word for a PEM file it could not read
        return "not PEM, or an encrypted key (give it unencrypted, 0600)"
    return text[:1].lower() + text[1:]


# OpenSSL's X509_V_ERR_ codes for a certificate no trusted CA signed (unable to get the
# issuer's certificate, locally or at all; self-signed; self-signed in the chain; unable to
# verify the leaf's signature), and for one made out to another name or address
_UNKNOWN_ISSUER = frozenset({2, 18, 19, 20, 21})
_OTHER_NAME = frozenset({62, 64})


def describe(e: Exception, given=None) -> str:
    """What a failed TLS connection or handshake says after ``cannot connect to HOST:PORT: ``;
    a certificate the client does not trust, with the way out. ``given``: the client's
    ``ssl=`` (None or True: the context came from ``$SHMQ_TLS_CA`` or the system's CAs)."""
    if isinstance(e, ssl.SSLError):
        return f"TLS {_reason(e)}{_way_out(e, given)}"
    return (e.strerror if isinstance(e, OSError) else None) or str(e)


def _way_out(e: ssl.SSLError, given) -> str:
    code = getattr(e, "verify_code", None)
    if code in _OTHER_NAME:
        return " (connect by a name or address the server's certificate holds: its subjectAltName)"
    if code not in _UNKNOWN_ISSUER:
        return ""
    if isinstance(given, ssl.SSLContext):
        return (" (the ssl= context trusts no CA that signed the server's certificate: give it the CA that did, "
                "ssl.create_default_context(cafile=CA))")
    ca = os.environ.get(CA_ENV)
    who = f"${CA_ENV} {ca} did not sign" if ca else "none of the system's CAs signed"
    return (f" ({who} the server's certificate: set ${CA_ENV} to the CA file that did, or give ssl= a context "
            "that trusts it)")


def note_refused(e: BaseException, tls: bool) -> None:
    """A connection the server closed at its HELLO was most likely refused for TLS: a
    plain one by a TLS port, a TLS one for its client certificate (TLS 1.3 tells the
    client no more). ``e``'s message (a BrokerUnavailable's) says so."""
    if not (isinstance(e, ConnectionError) and len(e.args) == 1 and isinstance(e.args[0], str)):
        return
    if not e.args[0].endswith("connection closed by the server"):
        return
    if tls:
        e.args = (f"{e.args[0]} (at the HELLO, over TLS: a server with --tls-client-ca closes connections that show "
                  f"no client certificate its CA signed; give one: ${CERT_ENV}, or ssl=)",)
    else:
        e.args = (f"{e.args[0]} (at the HELLO: a server with --tls-cert closes plain connections; use tcps://)",)


def readable_key_warning(cert: str, key: str | None = None) -> str | None:
    """The warning for a server's private key (``key``, else the ``cert`` file it is in)
    that every user of this host can read, naming the command that closes it; else None."""
    path = key or cert
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not st.st_mode & 0o004:
        return None
    named = f"--tls-key {path}" if key else f"--tls-cert {path} (it holds the private key)"
    fix = f"chmod 600 {path}"
    if st.st_uid != os.geteuid():  # not ours: 0600 would lock this server out of it
        fix = f"chown {_user_name(os.geteuid())} {path} && {fix}"
    return (f"{named} has mode {st.st_mode & 0o777:04o}: every user of this host can read the server's private key; "
            f"run {fix}")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _loaded(what: str, load, *args) -> None:
    try:
        load(*args)
    except (OSError, ssl.SSLError) as e:  # (SSLError is an OSError: its reason first)
        raise ValueError(f"{what}: {_reason(e)}") from None


def server_context(cert: str, key: str | None = None, client_ca: str | None = None) -> ssl.SSLContext:
    """The context a server listens with: its certificate chain ``cert`` and ``key`` (None:
    in ``cert``); with ``client_ca``, clients must show a certificate that CA signed
    (mutual TLS). ValueError in one line naming the file that cannot be used."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.num_tickets = 0  # no session tickets after the handshake: nothing but replies for a client to read
    named = f"--tls-cert {cert} / --tls-key {key}" if key else f"--tls-cert {cert}"
    _loaded(f"{named}: not a certificate and its key", ctx.load_cert_chain, cert, key, _NO_PASSWORD)
    if client_ca is not None:
        _loaded(f"--tls-client-ca {client_ca}: no CA certificate", ctx.load_verify_locations, client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@functools.lru_cache(maxsize=4)
def _default_client_context(ca, cert, key) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)  # None: the system's CAs
    if cert is not None:
        _loaded(f"${CERT_ENV} {cert} / ${KEY_ENV} {key or cert}: not a certificate and its key",
                ctx.load_cert_chain, cert, key, _NO_PASSWORD)
    return ctx


def client_context(given=None) -> ssl.SSLContext:
    """The context a ``tcps://`` client connects with: ``given`` (an ``ssl.SSLContext``),
    else the system's CAs, or only the CA file ``$SHMQ_TLS_CA``, with the client
    certificate ``$SHMQ_TLS_CERT`` (and ``$SHMQ_TLS_KEY``) if set (mutual TLS).
    ValueError in one line when a file named there cannot be used."""
    if isinstance(given, ssl.SSLContext):
        return given
    if given not in (None, True):
        raise TypeError(f"ssl must be an ssl.SSLContext or True, not {type(given).__name__}")
    ca, cert, key = (os.environ.get(name) or None for name in (CA_ENV, CERT_ENV, KEY_ENV))
    if ca is not None:
        try:
            return _default_client_context(ca, cert, key)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"${CA_ENV} {ca}: no CA certificate ({_reason(e)})") from None
    return _default_client_context(None, cert, key)
