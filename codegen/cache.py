"""Disk cache of compiled object code (~/.cache/burjit, or $BURJIT_CACHE_DIR).

An entry is keyed by everything the code depends on: the graph's fingerprint, schedule and
memory plan, literal contents, build options, host CPU, llvmlite and the codegen sources
themselves (so editing codegen never loads stale code). Entries carry a checksum of their
payload: a truncated or corrupt file reads as a miss and is recompiled, never loaded; so is
object code for another machine (native.py checks it with engine.loadable).
Writes go to a temporary file first and are renamed into place (atomic on POSIX).

Entries are machine code this process runs, so whoever can write the directory can run code
as you: it must be yours and writable by you alone. A directory that is not (another owner,
group- or world-writable) is never read; steps compile as if it were empty, with one warning.
New directories are made with mode 0700.
"""

import hashlib
import os
import tempfile
import warnings
from pathlib import Path

MAGIC = b"burjit-object-1\n"


def directory():
    return Path(os.environ.get("BURJIT_CACHE_DIR") or Path.home() / ".cache" / "burjit")


def _sources_hash():
    """Hash of the code that generates machine code: codegen itself and the primitives' scalar rules.

    Taken at import, so it describes the code this process runs even if the files change later.
    """
    from burjit import primitives
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")) + [Path(primitives.__file__)]:
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


_SOURCES = _sources_hash()


def key(parts):
    """A hex digest of `parts` (any repr-able data) and the code generator's sources."""
    return hashlib.sha256(repr((_SOURCES, parts)).encode()).hexdigest()


def path(k):
    return directory() / f"{k}.o"


def _trusted(d):
    try:
        st = d.stat()
    except OSError:
        return False
    if st.st_uid == os.getuid() and not st.st_mode & 0o022:
        return True
    if str(d) not in _WARNED:
        _WARNED.add(str(d))
        warnings.warn(f"burjit: not reading the compile cache {d}: it must be owned by you and writable "
                      "by you alone (its entries are code this process runs)", RuntimeWarning, stacklevel=4)
    return False


_WARNED = set()


def load(k):
    """The object bytes stored under key k, or None if missing, corrupt or in an untrusted directory."""
    if not _trusted(directory()):
        return None
    try:
        data = path(k).read_bytes()
    except OSError:
        return None
    head, digest, payload = data[:len(MAGIC)], data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]
    if head != MAGIC or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def store(k, payload):
    """Write an entry atomically; a cache that cannot be written is silently skipped."""
    try:
        d = directory()
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _trusted(d):
            return
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{k[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path(k))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
