"""The filesystem boundary: the ``Filesystem`` interface and ``PosixFS``.

This is the ONLY module of ``straw`` that calls ``os.*`` on files.  Everything else
(packs, the store, later the catalog and the queue journal) receives a ``Filesystem``
and goes through it, so that every engine test can run on the simulated, crashable
filesystem of ``fault_injection.simfs`` (SimFS) or on ``FaultyFS`` (errno rules over a
real directory).

Contract that implementations must keep (SimFS simulates exactly this):

* Paths are absolute ``str`` paths.  No method follows a path through ``..``; callers
  build paths from a pool root and names they validated (see ``straw.refs``).
* ``writev`` and ``readinto`` are *positional* (``pwritev``/``preadv``): they never move
  a file offset, so a handle can be shared by threads and a crash model needs no cursor.
* Durability: data written with ``writev`` is durable only after ``fsync`` or
  ``fdatasync`` on the same file returned.  ``fdatasync`` also makes the file size
  durable when the write extended it (POSIX: metadata needed to read the data back).
  A new name (``open(create=True)``, ``mkdir``, ``rename``) is durable only after
  ``fsync_dir`` on its parent directory returned.
* After a failed ``fsync``/``fdatasync`` the dirty data may already be gone: callers must
  never retry the sync and assume success (straw turns it into ``StorageUnavailable``
  and abandons the pack).
* ``lock`` is an advisory, exclusive, cross-process (and on shared filesystems
  cross-client) lock held through an open handle; closing the handle releases it.
* ``open_beneath(root, rel)`` is how straw opens a file a *reference* names: it never
  leaves ``root``, whatever other processes do to the directories meanwhile (each
  component of ``rel`` is resolved relative to the descriptor of its parent, never
  following a symbolic link), and it never blocks: anything but a regular file (a FIFO,
  a device, a socket, a directory) is refused at once with ``NotBeneath``.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import errno
import fcntl
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Buffer = Any  # anything exposing the buffer protocol (bytes, memoryview, numpy arrays)


class NotBeneath(OSError):
    """``open_beneath`` refused the path: a component is a symbolic link or not a
    directory (it could lead outside the root), or the file is not a regular file."""


class SpecialFile(NotBeneath):
    """``open`` refused a FIFO, socket or device where straw expects a file or directory:
    reading or writing one could block for ever (a FIFO put in place of a journal segment
    or an archive index would hang ``straw inspect`` or ``RolloutArchive``).  A
    ``NotBeneath``, so callers refusing those refuse this too."""


def beneath_parts(rel: str) -> list[str]:
    """The components of a relative path for ``open_beneath``; ``ValueError`` for an
    absolute path, ``.``/``..`` or empty components (callers validate paths first: this
    is the last line of defence)."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"open_beneath needs a plain relative path, got {rel!r}")
    return parts


@dataclass(frozen=True)
class FileStat:
    """What straw needs to know about a file: size, inode, kind, and its number of links
    (0 once unlinked while still open: a read session drops such a descriptor)."""

    size: int
    inode: int
    is_dir: bool
    is_symlink: bool
    mtime_ns: int = 0
    nlink: int = 1


class Filesystem(abc.ABC):
    """Every file operation straw performs.  Handles are opaque integers."""

    # --- handles ---------------------------------------------------------------
    @abc.abstractmethod
    def open(
        self, path: str, *, write: bool = False, create: bool = False, exclusive: bool = False
    ) -> int:
        """Open ``path``; ``create`` makes it if missing, ``exclusive`` fails if it exists
        (``FileExistsError``).  Never follows a symlink in the last component when
        ``write`` is set.  Never blocks, and never returns a descriptor of anything but a
        regular file or a directory (``SpecialFile``): any path a user or another process
        can replace is opened this way, so a FIFO put there cannot hang a reader."""

    @abc.abstractmethod
    def open_beneath(self, root: str, rel: str) -> int:
        """Open the regular file ``rel`` (relative, ``/``-separated) beneath the directory
        ``root`` for reading, following no symbolic link in any component of ``rel`` and
        without blocking.  ``FileNotFoundError`` if a component is missing; ``NotBeneath``
        if one is a symlink or not a directory, or the file is not a regular file."""

    @abc.abstractmethod
    def close(self, fd: int) -> None: ...

    @abc.abstractmethod
    def writev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        """Write all ``buffers`` back to back at ``offset``; returns the byte count.
        Short writes are retried internally; an error raises ``OSError``."""

    @abc.abstractmethod
    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        """Fill ``buffer`` from ``offset``; returns how many bytes were read (short at EOF)."""

    @abc.abstractmethod
    def fsync(self, fd: int) -> None: ...

    @abc.abstractmethod
    def fdatasync(self, fd: int) -> None: ...

    @abc.abstractmethod
    def truncate(self, fd: int, size: int) -> None: ...

    @abc.abstractmethod
    def fstat(self, fd: int) -> FileStat: ...

    def reserve(self, fd: int, offset: int, length: int, *, keep_size: bool = False) -> bool:
        """Reserve space ahead of writes to ``offset .. offset + length``, so that a full
        disk fails here and not in the write.  By default (``posix_fallocate``) the file
        size grows to at least ``offset + length`` and the new range reads as zeros: the
        catalog and the queue journal reserve so, and their appends inside the reserved
        range then change no size.  With ``keep_size`` (``fallocate`` with
        ``FALLOC_FL_KEEP_SIZE``) the blocks are allocated past the end of file and the
        size stays what was written: packs reserve so, because callers size a pool by its
        ``*.pack`` files; a truncate to the size releases what was not used.  Returns
        False when the filesystem cannot reserve so (the caller then simply appends)."""
        return False

    def drop_cached(self, fd: int, offset: int, length: int) -> None:
        """Drop this client's cached pages of the range (``posix_fadvise`` DONTNEED), so
        the next read asks the filesystem again.  Best effort, never an error.  Why: on a
        shared filesystem a page this client cached can outlive a reopen after another
        client wrote into it in place.  A file whose space was reserved by growing it (the
        catalog, a journal segment, a pack of an older straw) keeps its size while it is
        written, and a FUSE client may keep its kernel page cache across a reopen when
        the file looks unchanged (JuiceFS does when the mtime it last saw is the current
        one). A page cached while reading an earlier extent then reads as reserved zeros
        past that extent's end, whatever another client wrote there since.  The reader's
        visibility retry calls it (``straw.reader``).  By default: nothing cached to drop."""
        return None

    # --- locks -----------------------------------------------------------------
    @abc.abstractmethod
    def lock(self, fd: int, *, blocking: bool = True) -> bool:
        """Take the exclusive advisory lock of the open file; False if ``blocking`` is
        False and another holder has it."""

    @abc.abstractmethod
    def unlock(self, fd: int) -> None: ...

    # --- names -----------------------------------------------------------------
    @abc.abstractmethod
    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (new names, renames, unlinks) durable."""

    @abc.abstractmethod
    def mkdir(self, path: str) -> None:
        """Create one directory; ``FileExistsError`` if it exists."""

    @abc.abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src``."""

    @abc.abstractmethod
    def unlink(self, path: str) -> None: ...

    def unlink_beneath(self, root: str, rel: str) -> None:
        """Remove the file ``rel`` (relative, ``/``-separated) beneath the directory
        ``root``, following no symbolic link in any component of ``rel``: what a
        collection deletes is in the pool, whatever its directories were replaced with.
        ``FileNotFoundError`` if it is gone; ``NotBeneath`` if a component is a symlink or
        not a directory.  This default serves filesystems without symbolic links (the
        simulated ones); ``PosixFS`` walks directory descriptors."""
        beneath_parts(rel)
        self.unlink(os.path.join(root, rel))

    @abc.abstractmethod
    def stat(self, path: str) -> FileStat:
        """Stat without following a final symlink (``lstat``)."""

    @abc.abstractmethod
    def listdir(self, path: str) -> list[str]: ...

    @abc.abstractmethod
    def realpath(self, path: str) -> str:
        """Resolve every symlink of ``path`` (used to refuse paths leaving the pool)."""

    # --- conveniences built on the primitives (not overridden by implementations) ---
    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except FileNotFoundError:
            return False
        return True

    def makedirs(self, path: str) -> list[str]:
        """Create ``path`` and missing parents; returns the directories it created,
        outermost first, so that the caller can ``fsync_dir`` their parents."""
        missing: list[str] = []
        cur = path.rstrip("/") or "/"
        while not self.exists(cur):
            missing.append(cur)
            parent = os.path.dirname(cur)
            if parent == cur:
                break
            cur = parent
        created = []
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                self.mkdir(d)
                created.append(d)
        return created

    def makedirs_durable(self, path: str) -> None:
        """``makedirs`` and make every new name durable (D1: a new name is fsynced
        through its parent directory)."""
        for d in self.makedirs(path):
            self.fsync_dir(os.path.dirname(d))

    def read_to_end(self, fd: int, offset: int = 0, limit: int | None = None) -> bytes:
        """Everything from ``offset`` to the end of file (at most ``limit`` bytes), read
        until a short read: a size cached by another client's view may be stale."""
        out = bytearray()
        step = 1 << 20
        while limit is None or len(out) < limit:
            want = step if limit is None else min(step, limit - len(out))
            chunk = bytearray(want)
            n = self.readinto(fd, chunk, offset + len(out))
            out += memoryview(chunk)[:n]
            if n < want:
                break
        return bytes(out)

    def probe(self, path: str) -> bool:
        """Does ``path`` exist?  Asked through ``open``, a fresh lookup: a ``stat`` or a
        listing may be served from an attribute cache on a shared filesystem."""
        try:
            fd = self.open(path)
        except FileNotFoundError:
            return False
        with contextlib.suppress(OSError):
            self.close(fd)
        return True

    def read_file(self, path: str) -> bytes:
        fd = self.open(path)
        try:
            st = self.fstat(fd)
            if st.is_dir:  # a read of it fails naming no path (or reads nothing)
                raise not_a_file(fd, path)
            buf = bytearray(st.size)
            return bytes(buf[:self.readinto(fd, buf, 0)])
        finally:
            self.close(fd)

    def stage_file(self, path: str, data: Buffer) -> str:
        """Write ``data`` to a new temporary file beside ``path`` and fsync it; returns the
        temporary's path (nothing reads a temporary: every reader opens exact names).  A
        write or sync that fails removes the temporary: a full disk leaves none behind."""
        tmp = f"{path}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
        fd = self.open(tmp, write=True, create=True)
        try:
            try:
                self.truncate(fd, 0)
                self.writev(fd, [data], 0)
                self.fsync(fd)  # the content durable before its name can be
            finally:
                self.close(fd)
        except BaseException:
            self._discard(tmp)
            raise
        return tmp

    def write_file_durable(self, path: str, data: Buffer) -> None:
        """Write a new small file atomically and durably: ``stage_file``, rename, fsync
        of the directory; a failure before the rename leaves no temporary."""
        tmp = self.stage_file(path, data)
        try:
            self.rename(tmp, path)
        except BaseException:
            self._discard(tmp)
            raise
        self.fsync_dir(os.path.dirname(path))

    def _discard(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.unlink(path)


def _iov(buffers: Iterable[Buffer]) -> list[memoryview]:
    out = []
    for b in buffers:
        mv = b if isinstance(b, memoryview) else memoryview(b)
        if mv.ndim != 1 or mv.itemsize != 1 or not mv.c_contiguous:
            mv = mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())
        if len(mv):
            out.append(mv)
    return out


_IOV_MAX = 512
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class PosixFS(Filesystem):
    """The real thing: thin wrappers over ``os`` with positional I/O."""

    def open(
        self, path: str, *, write: bool = False, create: bool = False, exclusive: bool = False
    ) -> int:
        # O_NONBLOCK: opening a FIFO must not wait for its other end (it changes nothing
        # for regular files and directories); the fstat below refuses what is neither
        flags = os.O_CLOEXEC | os.O_NONBLOCK
        flags |= os.O_RDWR if write or create else os.O_RDONLY
        if write or create:
            flags |= os.O_NOFOLLOW
        if create:
            flags |= os.O_CREAT
        if exclusive:
            flags |= os.O_EXCL
        fd = os.open(path, flags, 0o644)
        try:
            mode = os.fstat(fd).st_mode
        except BaseException:
            os.close(fd)
            raise
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            os.close(fd)
            raise SpecialFile(errno.EINVAL, f"{path} is a {_kind(mode)}, not a regular file "
                                            "or a directory: remove it", path)
        return fd

    def open_beneath(self, root: str, rel: str) -> int:
        # Component by component from a descriptor of ``root``: a directory swapped for a
        # symlink at any moment is met by O_NOFOLLOW (ELOOP or ENOTDIR), never followed,
        # so there is no window between a check and the open.  O_NONBLOCK: opening a FIFO
        # must not wait for a writer (it has no effect on regular files).
        parts = beneath_parts(rel)
        dir_fd = _parent_beneath(root, parts, rel)
        try:
            fd = _open_at(parts[-1], _FILE_FLAGS, dir_fd, rel)
        finally:
            os.close(dir_fd)
        try:
            mode = os.fstat(fd).st_mode
        except BaseException:
            os.close(fd)
            raise
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise NotBeneath(errno.EINVAL, f"{parts[-1]!r} is not a regular file (a FIFO, "
                             "device, socket or directory)", rel)
        return fd

    def unlink_beneath(self, root: str, rel: str) -> None:
        parts = beneath_parts(rel)
        dir_fd = _parent_beneath(root, parts, rel)
        try:
            os.unlink(parts[-1], dir_fd=dir_fd)  # a final symlink is removed, not followed
        finally:
            os.close(dir_fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def writev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        views = _iov(buffers)
        total = 0
        while views:
            batch = views[:_IOV_MAX]
            n = os.pwritev(fd, batch, offset + total)
            if n <= 0:
                raise OSError(errno.EIO, "pwritev wrote nothing")
            total += n
            # drop what was written; keep the remainder of a partially written buffer
            while n and views:
                if n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                else:
                    views[0] = views[0][n:]
                    n = 0
        return total

    def drop_cached(self, fd: int, offset: int, length: int) -> None:
        try:  # pages wholly inside the range are dropped: widen it to page boundaries
            lo = offset - offset % _PAGE
            os.posix_fadvise(fd, lo, -(-(offset + length - lo) // _PAGE) * _PAGE,
                             os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):  # not supported here: nothing cached to drop
            pass

    def readinto(self, fd: int, buffer: Buffer, offset: int) -> int:
        mv = memoryview(buffer).cast("B")
        got = 0
        while got < len(mv):
            try:
                n = os.preadv(fd, [mv[got:]], offset + got)
            except IsADirectoryError:  # (preadv's error names no path)
                raise not_a_file(fd) from None
            if n == 0:
                break
            got += n
        return got

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fstat(self, fd: int) -> FileStat:
        return _to_stat(os.fstat(fd))

    def reserve(self, fd: int, offset: int, length: int, *, keep_size: bool = False) -> bool:
        if keep_size:
            if _fallocate is None:
                return False
            err = ctypes.get_errno() if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset,
                                                   length) != 0 else 0
        else:
            try:
                os.posix_fallocate(fd, offset, length)
                err = 0
            except OSError as e:
                err = e.errno or errno.EIO
        if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        if err:
            raise OSError(err, os.strerror(err))
        return True

    def lock(self, fd: int, *, blocking: bool = True) -> bool:
        # flock: works across processes locally and across clients on JuiceFS.
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def unlock(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, 0o755)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def stat(self, path: str) -> FileStat:
        return _to_stat(os.lstat(path))

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)


_FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h


def _load_fallocate() -> Any:
    """libc's ``fallocate(2)`` (Linux), which the ``os`` module does not expose with a
    mode; None where there is none (``reserve`` then reports no support)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, "fallocate64", None) or libc.fallocate  # 64-bit offsets
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_fallocate = _load_fallocate()

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _parent_beneath(root: str, parts: list[str], rel: str) -> int:
    """A descriptor of the directory holding ``parts[-1]`` beneath ``root``, reached
    component by component with O_NOFOLLOW (``NotBeneath`` at a symlink)."""
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            nxt = _open_at(name, _DIR_FLAGS, dir_fd, rel)
            os.close(dir_fd)
            dir_fd = nxt
    except BaseException:
        os.close(dir_fd)
        raise
    return dir_fd


def _open_at(name: str, flags: int, dir_fd: int, rel: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        # ELOOP: a symlink met by O_NOFOLLOW; ENOTDIR: a symlink or a file where a
        # directory belongs; ENXIO: a socket
        why = {errno.ELOOP: "is a symbolic link",
               errno.ENOTDIR: "is a symbolic link or not a directory",
               errno.ENXIO: "is not a regular file (a socket or device)"}.get(e.errno or 0)
        if why is not None:
            raise NotBeneath(e.errno, f"{name!r} {why}", rel) from None
        raise


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
             (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))
    return next((name for test, name in kinds if test(mode)), "special file")


def _to_stat(st: os.stat_result) -> FileStat:
    return FileStat(size=st.st_size, inode=st.st_ino, is_dir=stat.S_ISDIR(st.st_mode),
                    is_symlink=stat.S_ISLNK(st.st_mode), mtime_ns=st.st_mtime_ns,
                    nlink=st.st_nlink)


def not_a_file(fd: int, path: str | None = None) -> IsADirectoryError:
    """The directory ``fd`` (at ``path``, else where Linux says) read as a file, named."""
    with contextlib.suppress(OSError):
        path = path or os.readlink(f"/proc/self/fd/{fd}")
    return IsADirectoryError(errno.EISDIR, f"{path or f'<fd {fd}>'} is a directory where a "
                             "file belongs: remove it or give the file's path", path)


_loadavg_fd: int | None = None  # /proc/loadavg, opened once


def runnable_threads() -> int | None:
    """The threads runnable on this machine at this instant (the 4th field of
    ``/proc/loadavg``, "runnable/total"), or None where the platform does not tell.  A
    system statistic, not pool data; it is read here because every file straw opens is
    (the tensor loads ask it before they start a helper thread).  About 4 us."""
    global _loadavg_fd
    try:
        if _loadavg_fd is None:
            _loadavg_fd = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
        return int(os.pread(_loadavg_fd, 128, 0).split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None
