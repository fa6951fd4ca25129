"""Shared memory regions: a MAP_SHARED mapping of a file (normally on tmpfs) or of anonymous memory.

Owns: nothing process-specific. Every process uses it: the supervisor creates the files in the
runtime directory (``/dev/shm/appliance-<pid>/``) before it forks the process that consumes them,
everybody else opens them by name (see ``shm.topology``).

Why files and not ``multiprocessing.shared_memory``: that module registers every segment with the
``resource_tracker`` process, which unlinks the segment when *any* process that touched it exits;
a worker restart would then take the channel away from everybody else. A plain file on tmpfs lives
until the supervisor removes it.

Creation is atomic for openers: the file is made under a hidden temporary name in the same
directory (``.<name>.<pid>.<random>.tmp``), given all its blocks with ``posix_fallocate``,
optionally initialised through the ``init`` callback (ring/page headers), and only then renamed
over ``path``. An opener therefore never sees a short or half-initialised file, and a process
that still maps a replaced file keeps its old (now nameless) mapping.

Why the blocks up front: a page of a sparse file on tmpfs is allocated when it is first touched
through a map, by a read as much as by a write, and when the tmpfs is full that touch is a SIGBUS
in whichever process made it (a frontend writing a ring, a worker reading a page), with nothing
to catch. Allocated at creation, a full runtime dir is an ENOSPC from ``create`` instead, which
the supervisor answers (a refused CreateTopics, a start that exits with the runtime-dir status).

Mapping a region after ``fork`` is per process; ``Region.anonymous`` is only useful for regions made
before the fork (tests, heartbeats of children of one parent).
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
from typing import Callable

__all__ = ["Region", "allocate"]

PAGE_SIZE = 4096


def allocate(fd: int, size: int, offset: int = 0) -> None:
    """Give the file its blocks for [offset, offset + size), extending it when that reaches past
    its end: ENOSPC now rather than SIGBUS when a map touches the range. A file system without
    fallocate (EOPNOTSUPP, EINVAL) gets a sparse extension instead, as before."""
    try:
        os.posix_fallocate(fd, offset, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        if os.fstat(fd).st_size < offset + size:
            os.ftruncate(fd, offset + size)


class Region:
    """One MAP_SHARED mapping. ``buf`` is the ``mmap`` object; views of it are made by its users."""

    __slots__ = ("buf", "size", "path", "readonly", "_closed")

    def __init__(self, buf: mmap.mmap, size: int, path: str | None, readonly: bool) -> None:
        self.buf = buf
        self.size = size
        self.path = path
        self.readonly = readonly
        self._closed = False

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def create(cls, path: str, size: int,
               init: Callable[[mmap.mmap], None] | None = None) -> "Region":
        """Create (or atomically replace) the file at ``path`` with ``size`` zero bytes, map it rw.

        ``init`` (optional) is called with the mapping before the file gets its name, so that
        headers written there are visible to the very first opener.
        """
        if size <= 0:
            raise ValueError(f"region size must be positive, got {size}")
        directory, name = os.path.split(os.fspath(path))
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        buf: mmap.mmap | None = None
        try:
            allocate(fd, size)
            buf = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)   # MAP_SHARED, rw
            if init is not None:
                init(buf)
            os.rename(tmp, path)
        except BaseException:
            if buf is not None:
                try:
                    buf.close()
                except BufferError:
                    pass
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        finally:
            os.close(fd)  # mmap keeps its own duplicate of the descriptor
        return cls(buf, size, os.fspath(path), False)

    @classmethod
    def open(cls, path: str, *, readonly: bool = False) -> "Region":
        """Map an existing file; its current size is the region size."""
        flags = (os.O_RDONLY if readonly else os.O_RDWR) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise ValueError(f"{path}: empty file cannot be mapped")
            # access= (not prot=): only ACCESS_READ makes CPython export read-only buffers, so a
            # stray write raises TypeError instead of a SIGSEGV on a PROT_READ page.
            buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        return cls(buf, size, os.fspath(path), readonly)

    @classmethod
    def anonymous(cls, size: int) -> "Region":
        """MAP_SHARED|MAP_ANONYMOUS memory: shared with children forked after this call."""
        if size <= 0:
            raise ValueError(f"region size must be positive, got {size}")
        # ACCESS_WRITE = MAP_SHARED, rw; with fileno -1 CPython adds MAP_ANONYMOUS itself.
        buf = mmap.mmap(-1, size, access=mmap.ACCESS_WRITE)
        return cls(buf, size, None, False)

    # -- life cycle ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Unmap. Idempotent.

        If somebody still holds a memoryview of the mapping (a payload returned by ``Ring.peek``),
        the unmap is left to the garbage collector: unmapping under a live view would turn the
        next access into a segfault, and CPython refuses it anyway (BufferError).
        """
        if self._closed:
            return
        self._closed = True
        try:
            self.buf.close()
        except BufferError:
            pass

    def unlink(self) -> None:
        """Remove the file (the mapping stays valid until closed). Missing file: ignored."""
        if self.path is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.path if self.path is not None else "anonymous"
        return f"Region({where!r}, size={self.size}{', readonly' if self.readonly else ''})"
