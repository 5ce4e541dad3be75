"""The endpoint's secrets from files that are replaced while the agent runs: the TLS certificate and key, the
basic-auth user and password. A Kubernetes Secret volume is updated in place (the kubelet swaps its `..data` link,
a minute or so after the Secret changes), cert-manager renews certificates before they expire, and an operator
rotates a leaked password: each must take effect without a restart, and the old one must stop working.

Each source looks at its files' identity (device, inode, size, modification time; through symlinks, so a swapped
`..data` link reads as a change) no more than once a LOOK_EVERY_S, on the thread that is about to use the secret
(the server's loop before a TLS handshake, the request's thread before a check of the credentials), and reads
them again only when that identity changed. A new set that cannot be used (a key that does not match its
certificate yet, a renewal caught between its two files, an empty or unreadable password file) leaves the last
good one in place, said once per change in the log, and is tried again at the next change. The first load is
strict: the caller reports its failure at the start.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

LOG = logging.getLogger("outrider.exporters.rotation")
LOOK_EVERY_S = 1.0
FileIdentity = tuple[int, int, int, int] | None
Identity = tuple[FileIdentity, ...]


def identity(paths: tuple[str, ...]) -> Identity:
    """Each file's (device, inode, size, mtime in ns), None for one that cannot be stat'ed."""
    out: list[FileIdentity] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class _Watched:
    """Files looked at no more than once a LOOK_EVERY_S; `changed()` is True once per change of their identity."""

    def __init__(self, paths: tuple[str, ...], clock: Callable[[], float]) -> None:
        self.paths = paths
        self._clock = clock
        self._lock = threading.Lock()  # the loop thread and the workers may look at once: one of them reloads
        self._seen = identity(paths)
        self._looked = clock()

    def changed(self) -> bool:
        now = self._clock()
        if now - self._looked < LOOK_EVERY_S or not self._lock.acquire(blocking=False):
            return False
        try:
            self._looked = now
            current = identity(self.paths)
            if current == self._seen:
                return False
            self._seen = current
            return True
        finally:
            self._lock.release()


class TlsFiles:
    """The server's TLS context from a certificate (chain) file and its key file, made anew when they change."""

    def __init__(self, cert_file: str, key_file: str, clock: Callable[[], float] = time.monotonic) -> None:
        """Raises OSError (naming the certificate) when the pair cannot be loaded now."""
        self.cert_file, self.key_file = cert_file, key_file
        self._watched = _Watched((cert_file, key_file), clock)
        self._context = self._load()
        self.reloads = 0  # contexts made after the first

    def _load(self) -> ssl.SSLContext:
        import ssl  # only here: it loads OpenSSL (about 4 MiB of RSS), which a plain endpoint does without

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise OSError(getattr(e, "errno", None), f"cannot load TLS certificate {self.cert_file}: {e}") from None
        return context

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: the files' current pair, or the last one that loaded."""
        if self._watched.changed():
            try:
                self._context = self._load()
            except OSError as e:
                LOG.warning("%s changed, but the new pair cannot be used (%s); serving the previous certificate "
                            "until the files change again", self.cert_file, e.strerror or e)
            else:
                self.reloads += 1
                LOG.info("TLS certificate %s reloaded", self.cert_file)
        return self._context


class BasicAuthFiles:
    """The basic-auth credentials: the password from a file, the user from a file or given, read again when a
    file changes."""

    def __init__(self, password_file: str, username: str = "", username_file: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Raises SecretFileError (naming the file and what is wrong) when the credentials cannot be read now."""
        self.password_file, self.username_file, self._username = password_file, username_file, username
        self._watched = _Watched(tuple(p for p in (password_file, username_file) if p), clock)
        self._credentials = self._read()
        self.reloads = 0

    def _read(self) -> tuple[str, str]:
        username = _read_secret(self.username_file) if self.username_file else self._username
        return username, _read_secret(self.password_file)

    def current(self) -> tuple[str, str]:
        """The user and password a request must carry now."""
        if self._watched.changed():
            try:
                self._credentials = self._read()
            except SecretFileError as e:
                LOG.warning("basic-auth credentials changed, but %s; the previous ones stay in force until the "
                            "files change again", e)
            else:
                self.reloads += 1
                LOG.info("basic-auth credentials reloaded from %s", ", ".join(self._watched.paths))
        return self._credentials


class SecretFileError(ValueError):
    """A secret file that cannot be used: `path` names it."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(why)
        self.path = path


def _read_secret(path: str) -> str:
    """A secret file's content, surrounding whitespace removed (a Secret written with `echo` ends in a newline)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise SecretFileError(path, f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not text:
        raise SecretFileError(path, f"{path} is empty")
    return text
