"""The artifact store: content-addressed files that a job's results refer to.

A value JSON cannot hold (a NumPy array, a model, any picklable object) and a file a job
attaches are stored here once per distinct content, under the SHA-256 of their bytes; the
job's results hold a reference, ``{"$artifact": DIGEST, "kind": ..., "size": ...}``. The
database holds references only, so what nothing references can be reclaimed.

Where the store is: ``?artifacts=`` in the database URL, else ``$JOBMAN_ARTIFACTS`` (what
``jobman --artifacts`` sets), else beside a SQLite database (``runs.db`` → ``runs.artifacts/``),
else beside the job workdirs (``EXPROOT/_artifacts``, a directory a cluster shares already).
A location with a scheme (``s3://bucket/path``) is an fsspec URL, read and written through
fsspec when it is installed.

Nothing is read or written outside the store: an artifact is found by its digest only (64 hex
digits, so no ``..`` nor absolute path), and every step below the root is opened without
following symbolic links. Standard library only (NumPy and fsspec imported when used): a job
process writes its artifacts itself, so that a large array crosses no socket.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from .errors import UsageError

if TYPE_CHECKING:
    from .url import DbTarget

REF = "$artifact"  # the key of a reference in a job's results
DEFAULT_FOLDER = "_artifacts"  # under the job workdirs' root, for a database that is not a file
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_REF_TEXT = re.compile(r'"\$artifact": ?"([0-9a-f]{64})"')
_CHUNK = 1 << 20
KINDS = ("npy", "pickle", "file")


class ArtifactError(UsageError):
    """An artifact could not be found or read."""


def is_ref(value: Any) -> bool:
    """Whether ``value`` is a reference to an artifact, as stored in a job's results."""
    return isinstance(value, Mapping) and isinstance(value.get(REF), str) and value.get("kind") in KINDS


def check_digest(digest: str) -> str:
    """``digest`` if it names an artifact (64 lowercase hex digits); a UsageError otherwise."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ArtifactError(f"{str(digest)[:80]!r} is not an artifact digest (64 hexadecimal digits)")
    return digest


def digests_in_text(text: str | None) -> set[str]:
    """The digests referred to in a stored JSON text (a job's results, an event's saved results)."""
    return set(_REF_TEXT.findall(text)) if text and REF in text else set()


def refs_in(value: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, reference)`` for each artifact referred to in ``value``, named by dotted path."""
    if is_ref(value):
        yield path, dict(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from refs_in(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from refs_in(item, f"{path}[{index}]")


def location(
    dialect: str, option: str | None, sqlite_path: str | None, exproot: str | os.PathLike | None = None
) -> str:
    """Where a database's artifacts are (see the module's docstring for the order)."""
    given = option or os.environ.get("JOBMAN_ARTIFACTS")
    if given:
        return given if _scheme(given) else os.path.abspath(os.path.expanduser(given))
    if dialect == "sqlite" and sqlite_path:
        return os.path.splitext(os.path.abspath(sqlite_path))[0] + ".artifacts"
    root = exproot or os.environ.get("JOBMAN_EXPROOT") or "jobman_runs"
    return os.path.join(os.path.abspath(root), DEFAULT_FOLDER)


def for_database(target: DbTarget, exproot: str | os.PathLike | None = None) -> ArtifactStore:
    """The artifact store of the database ``target`` names (``exproot``: where its job workdirs go)."""
    return open_store(location(target.dialect, target.artifacts, target.sqlite_path, exproot))


def _scheme(where: str) -> str | None:
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.\-]*)://", where)
    return match.group(1).lower() if match and match.group(1).lower() != "file" else None


def open_store(where: str) -> ArtifactStore:
    """The store at ``where``: a directory, or an fsspec URL (``s3://...``) when fsspec is installed."""
    if where.startswith("file://"):
        where = where[len("file://") :]
    if _scheme(where):
        return FsspecStore(where)
    return ArtifactStore(where)


@dataclass(frozen=True)
class Stored:
    """An artifact just stored: its digest and size."""

    digest: str
    size: int


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes what goes through it on the way to ``sink``."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.hash = hashlib.sha256()
        self.size = 0
        self._stored: Stored | None = None  # once the artifact is in its place

    @property
    def stored(self) -> Stored:
        if self._stored is None:
            raise RuntimeError("the artifact is stored at the end of its writer's block")
        return self._stored

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.sink.write(view)
        self.size += len(view)
        return len(view)


class ArtifactStore:
    """A directory of artifacts: ``ROOT/sha256/ab/abcdef...``; in-progress writes in ``ROOT/tmp``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"ArtifactStore({str(self.root)!r})"

    @property
    def where(self) -> str:
        return str(self.root)

    # -- writing -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def writer(self) -> Iterator[_HashingWriter]:
        """A file to write one artifact into; stored under its digest when the block ends (``.stored``)."""
        tmpdir = self.root / "tmp"
        tmpdir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=tmpdir, prefix="put-")
        try:
            with os.fdopen(fd, "wb", buffering=_CHUNK) as fh:
                out = _HashingWriter(fh)
                yield out
            digest = out.hash.hexdigest()
            self._place(tmp, digest)
            out._stored = Stored(digest, out.size)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _place(self, tmp: str, digest: str) -> None:
        """Move a written file to its digest's place, or keep the copy there (touched: just used)."""
        folder = self.root / "sha256" / digest[:2]
        folder.mkdir(parents=True, exist_ok=True)
        if folder.is_symlink():
            raise ArtifactError(f"the artifact store {self.root} holds a symbolic link where a folder should be")
        final = folder / digest
        try:
            st = os.lstat(final)
        except FileNotFoundError:
            os.chmod(tmp, 0o444)
            os.replace(tmp, final)  # atomic: a reader sees the whole artifact or none
            return
        if not _regular(st.st_mode):  # something planted there: replaced, never followed
            os.chmod(tmp, 0o444)
            os.replace(tmp, final)
        else:
            os.utime(final, follow_symlinks=False)

    def put_bytes(self, data: bytes) -> Stored:
        with self.writer() as out:
            out.write(data)
        return out.stored

    def put_file(self, path: str | os.PathLike) -> Stored:
        with open(path, "rb") as src, self.writer() as out:
            shutil.copyfileobj(src, out, _CHUNK)
        return out.stored

    def put_object(self, value: Any) -> dict[str, Any]:
        """Store a value; its reference. An array of numbers is kept as a ``.npy`` file (readable without
        unpickling); anything else is pickled (cloudpickle, so a class of a script too). A value that
        cannot be pickled raises TypeError naming it."""
        kind = "npy" if _plain_array(value) else "pickle"
        try:
            stored = self._put_value(value, kind, pickle)
        except (pickle.PicklingError, AttributeError) as exc:  # a class of a script, or local to a function
            cloudpickle = _cloudpickle()
            if cloudpickle is None:
                raise TypeError(f"{type(value).__name__} cannot be pickled: {exc}") from None
            try:
                stored = self._put_value(value, kind, cloudpickle)
            except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as again:
                raise TypeError(f"{type(value).__name__} cannot be pickled: {again}") from None
        except (TypeError, RecursionError) as exc:  # an open file, a lock, a generator: nothing to keep
            raise TypeError(f"{type(value).__name__} cannot be pickled: {exc}") from None
        return {REF: stored.digest, "kind": kind, "size": stored.size, "type": _type_name(value)}

    def _put_value(self, value: Any, kind: str, pickler: Any) -> Stored:
        with self.writer() as out:
            if kind == "npy":
                import numpy

                numpy.save(out, value, allow_pickle=False)
            else:
                pickler.dump(value, out, protocol=5)
        return out.stored

    def attach_file(self, path: str | os.PathLike) -> dict[str, Any]:
        """Store a file; its reference (with the file's name)."""
        stored = self.put_file(path)
        return {REF: stored.digest, "kind": "file", "size": stored.size, "filename": os.path.basename(path)}

    # -- reading -----------------------------------------------------------------------------
    def open(self, digest: str) -> BinaryIO:
        """The artifact's bytes as a file, opened without following any link below the store's root."""
        check_digest(digest)
        flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        dflags = flags | os.O_DIRECTORY
        fds: list[int] = []
        try:
            fds.append(os.open(self.root, os.O_RDONLY | os.O_DIRECTORY))
            for part in ("sha256", digest[:2]):
                fds.append(os.open(part, dflags, dir_fd=fds[-1]))
            fd = os.open(digest, flags, dir_fd=fds[-1])
        except FileNotFoundError:
            raise ArtifactError(_missing(digest, self.where)) from None
        except OSError as exc:  # ELOOP: a link planted in the store
            raise ArtifactError(f"artifact {digest[:12]} cannot be read from {self.where}: {exc.strerror}") from None
        finally:
            for d in fds:
                os.close(d)
        if not _regular(os.fstat(fd).st_mode):
            os.close(fd)
            raise ArtifactError(f"artifact {digest[:12]} in {self.where} is not a file")
        return os.fdopen(fd, "rb", buffering=_CHUNK)

    def get_bytes(self, digest: str) -> bytes:
        with self.open(digest) as fh:
            return fh.read()

    def copy_to(self, digest: str, out: IO[bytes]) -> int:
        """Write the artifact to ``out``, checking its digest on the way; the bytes written."""
        hasher, size = hashlib.sha256(), 0
        with self.open(digest) as fh:
            while chunk := fh.read(_CHUNK):
                hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
        if hasher.hexdigest() != digest:
            raise ArtifactError(f"artifact {digest[:12]} in {self.where} is damaged: its bytes no longer match")
        return size

    def load(self, ref: Mapping[str, Any]) -> Any:
        """What a reference refers to, as the job gave it: the array, the object, or an :class:`ArtifactFile`."""
        digest, kind = check_digest(ref[REF]), ref.get("kind")
        if kind == "file":
            return ArtifactFile(self, digest, int(ref.get("size", 0)), str(ref.get("filename", digest)))
        with self.open(digest) as fh:
            if kind == "npy":
                import numpy

                return numpy.load(fh, allow_pickle=False)
            return pickle.load(fh)

    def has(self, digest: str) -> bool:
        try:
            self.open(digest).close()
        except ArtifactError:
            return False
        return True

    # -- reclaiming --------------------------------------------------------------------------
    def digests(self) -> Iterator[tuple[str, int, float]]:
        """``(digest, size, mtime)`` of every artifact stored."""
        base = self.root / "sha256"
        if not base.is_dir():
            return
        for folder in sorted(base.iterdir()):
            if folder.is_symlink() or not folder.is_dir():
                continue
            for entry in os.scandir(folder):
                if _DIGEST.match(entry.name):
                    st = entry.stat(follow_symlinks=False)
                    yield entry.name, st.st_size, st.st_mtime

    def remove(self, digest: str) -> bool:
        """Remove one artifact (never following a link); whether it was there."""
        check_digest(digest)
        try:
            os.unlink(self.root / "sha256" / digest[:2] / digest)
        except FileNotFoundError:
            return False
        return True

    def stale_temporaries(self, older_than: float) -> int:
        """Remove writes left unfinished (a job killed mid-write) older than ``older_than``; how many."""
        removed = 0
        tmpdir = self.root / "tmp"
        if tmpdir.is_dir():
            for entry in os.scandir(tmpdir):
                if entry.stat(follow_symlinks=False).st_mtime < older_than:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
        return removed


class FsspecStore(ArtifactStore):
    """The store at an fsspec URL (``s3://bucket/prefix``, ``memory://x``): the same layout, through fsspec."""

    def __init__(self, url: str) -> None:
        try:
            import fsspec  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError:
            raise UsageError(f"the artifact store {url} needs fsspec: pip install 'jobman-sql[fsspec]'") from None
        self.fs, self.base = fsspec.core.url_to_fs(url)
        self.url = url.rstrip("/")
        self.root = Path(self.base)

    def __repr__(self) -> str:
        return f"FsspecStore({self.url!r})"

    @property
    def where(self) -> str:
        return self.url

    def _path(self, digest: str) -> str:
        return f"{self.base.rstrip('/')}/sha256/{digest[:2]}/{digest}"

    @contextlib.contextmanager
    def writer(self) -> Iterator[_HashingWriter]:
        with tempfile.TemporaryFile() as spool:  # the digest names the object: known only at the end
            out = _HashingWriter(spool)
            yield out
            digest = out.hash.hexdigest()
            target = self._path(digest)
            if not self.fs.exists(target):
                spool.seek(0)
                with self.fs.open(target, "wb") as remote:
                    shutil.copyfileobj(spool, remote, _CHUNK)
            out._stored = Stored(digest, out.size)

    def open(self, digest: str) -> BinaryIO:
        target = self._path(check_digest(digest))
        if not self.fs.exists(target):
            raise ArtifactError(_missing(digest, self.where))
        return self.fs.open(target, "rb")  # type: ignore[no-any-return,unused-ignore]

    def digests(self) -> Iterator[tuple[str, int, float]]:
        base = f"{self.base.rstrip('/')}/sha256"
        if not self.fs.exists(base):
            return
        for info in self.fs.find(base, detail=True).values():
            name = str(info["name"]).rsplit("/", 1)[-1]
            if _DIGEST.match(name):
                mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
                yield name, int(info.get("size", 0)), mtime.timestamp() if hasattr(mtime, "timestamp") else mtime

    def remove(self, digest: str) -> bool:
        target = self._path(check_digest(digest))
        if not self.fs.exists(target):
            return False
        self.fs.rm(target)
        return True

    def stale_temporaries(self, older_than: float) -> int:
        return 0


@dataclass(frozen=True)
class ArtifactFile:
    """A file a job attached, as given back to Python: read it, open it, or copy it to a path."""

    store: ArtifactStore
    digest: str
    size: int
    filename: str

    def open(self) -> BinaryIO:
        return self.store.open(self.digest)

    def read_bytes(self) -> bytes:
        return self.store.get_bytes(self.digest)

    def save_to(self, path: str | os.PathLike) -> Path:
        """Copy the file to ``path`` (a folder: the file's own name in it); the path written."""
        target = Path(path)
        if target.is_dir():
            target = target / self.filename
        with open(target, "wb") as out:
            self.store.copy_to(self.digest, out)
        return target


def file_name(name: str, ref: Mapping[str, Any]) -> str:
    """The name an artifact is saved under when fetched: a file's own, else its name with .npy or .pkl."""
    if ref.get("kind") == "file" and ref.get("filename"):
        return os.path.basename(str(ref["filename"])) or name
    return f"{name}.npy" if ref.get("kind") == "npy" else f"{name}.pkl"


def load_refs(value: Any, store: ArtifactStore) -> Any:
    """``value`` with every artifact reference in it replaced by what it refers to."""
    if is_ref(value):
        return store.load(value)
    if isinstance(value, dict):
        return {k: load_refs(v, store) for k, v in value.items()} if any(refs_in(value)) else value
    if isinstance(value, list):
        return [load_refs(v, store) for v in value] if any(refs_in(value)) else value
    return value


def _missing(digest: str, where: str) -> str:
    return (
        f"artifact {digest[:12]} is not in the store {where} "
        "(if the jobs keep it elsewhere, name it with --artifacts, ?artifacts= or $JOBMAN_ARTIFACTS)"
    )


def _regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


def _plain_array(value: Any) -> bool:
    """A NumPy array that ``.npy`` holds without pickling (not of Python objects)."""
    numpy = __import__("sys").modules.get("numpy")  # not imported by us: a job that has none returns none
    return numpy is not None and type(value) is numpy.ndarray and not value.dtype.hasobject


def _cloudpickle() -> Any:
    """cloudpickle, for what pickle can only name and not find again (a class local to a function);
    None without it. Not used first: it would turn an open file into its text, which is not the file."""
    try:
        import cloudpickle  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return None
    return cloudpickle


def _type_name(value: Any) -> str:
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
