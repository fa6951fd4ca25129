"""A FUSE file system that loses what was not synced: the power cut of the durability tests.

Owns: the file system's state (its in-memory view and the durable store under a backing
directory); runs in its own process (``python tests/integration/lazyfs.py BACKING MOUNTPOINT``,
started and stopped by ``LazyMount``), never inside a test process or the appliance.

Jepsen's LazyFS idea (its NATS 2.12 analysis, December 2025): a kill -9 keeps the page cache, so
only a file system that forgets unsynced writes can test what ``fsync`` promises. The rules are
POSIX's strict ones, stricter than ext4's in practice:

- A file's data (its bytes and its size) is durable up to its last ``fsync``/``fdatasync`` (and
  ``msync``, which the kernel sends here as an fsync after writing back the mapped pages). The
  sync covers the whole file, not only a range.
- A name (create, rename, unlink, link, mkdir, rmdir) is durable once its directory is fsynced:
  the directory's entries at that moment become its durable entries. A file created and synced
  in a directory never synced is lost at a cut; a rename without the directory's sync is undone.
- The cut is the death of this process (SIGKILL) and an unmount: everything in memory is gone,
  the kernel's page cache of the mount with it, and the next mount over the same backing
  directory serves what was durable.

The backing directory holds the durable state only: ``objects/<ino>`` (a file's durable bytes)
and ``tree.json`` (each directory's durable entries, each inode's kind and mode), replaced
atomically (this process can be killed in the middle of a sync, which is a power cut during an
fsync: the sync never returned, so either state is allowed; ``tree.json`` is one or the other).
The in-memory view keeps, per file, its dirty pages over the durable bytes. The class
``LazyFS`` is the model: its methods are the FUSE operations, callable directly by the unit tests
(``tests/unit/test_lazyfs.py``), and ``cut()`` forgets in place what a new process would.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time

PAGE = 65536
ROOT_INO = 1
TREE = "tree.json"
OBJECTS = "objects"


class FsError(OSError):
    """An errno answer; ``main`` maps it to mfusepy's FuseOSError."""

    def __init__(self, code: int):
        super().__init__(code, os.strerror(code))


class Inode:
    __slots__ = ("ino", "kind", "mode", "nlink", "entries", "size", "dirty", "limit",
                 "durable_size", "opens", "atime", "mtime", "ctime")

    def __init__(self, ino: int, kind: str, mode: int):
        self.ino = ino
        self.kind = kind              # "d" or "f"
        self.mode = mode
        self.nlink = 0
        self.entries: dict[str, int] = {}          # a directory's current entries
        self.size = 0
        self.dirty: dict[int, bytearray] = {}      # page number -> PAGE bytes, not yet durable
        self.limit = 0                # durable bytes below this are still the file's (a shrink lowers it)
        self.durable_size = 0
        self.opens = 0
        now = time.time_ns()
        self.atime = self.mtime = self.ctime = now


class LazyFS:
    """The file system's state: the current view in memory over the durable store."""

    def __init__(self, backing: str):
        self.backing = backing
        os.makedirs(os.path.join(backing, OBJECTS), exist_ok=True)
        self._fds: dict[int, int] = {}
        self._load()

    # ---- the durable store -------------------------------------------------------------------

    def _load(self) -> None:
        try:
            with open(os.path.join(self.backing, TREE)) as f:
                tree = json.load(f)
        except FileNotFoundError:
            tree = {"inodes": {str(ROOT_INO): ["d", 0o40755]}, "dirs": {str(ROOT_INO): {}}}
        self.durable_inodes: dict[int, tuple[str, int]] = {
            int(k): (v[0], v[1]) for k, v in tree["inodes"].items()}
        self.durable_dirs: dict[int, dict[str, int]] = {
            int(k): dict(v) for k, v in tree["dirs"].items()}
        self.inodes: dict[int, Inode] = {}
        # Only what the root reaches survives; an object nothing durable names is garbage.
        todo = [ROOT_INO]
        while todo:
            ino = todo.pop()
            if ino in self.inodes:
                self.inodes[ino].nlink += 1
                continue
            kind, mode = self.durable_inodes[ino]
            node = Inode(ino, kind, mode)
            node.nlink = 1
            self.inodes[ino] = node
            if kind == "d":
                node.entries = dict(self.durable_dirs.get(ino, {}))
                todo.extend(node.entries.values())
            else:
                try:
                    node.size = node.durable_size = node.limit = os.stat(self._object(ino)).st_size
                except FileNotFoundError:
                    pass
        objects = os.path.join(self.backing, OBJECTS)
        highest = max(self.durable_inodes)
        for name in os.listdir(objects):
            highest = max(highest, int(name))
            if int(name) not in self.inodes:
                os.unlink(os.path.join(objects, name))
        self.next_ino = highest + 1

    def _object(self, ino: int) -> str:
        return os.path.join(self.backing, OBJECTS, str(ino))

    def _fd(self, ino: int) -> int:
        fd = self._fds.get(ino)
        if fd is None:
            fd = self._fds[ino] = os.open(self._object(ino), os.O_RDWR | os.O_CREAT, 0o600)
        return fd

    def _save_tree(self) -> None:
        tree = {"inodes": {str(k): list(v) for k, v in self.durable_inodes.items()},
                "dirs": {str(k): v for k, v in self.durable_dirs.items()}}
        path = os.path.join(self.backing, TREE)
        with open(path + ".tmp", "w") as f:
            json.dump(tree, f)
        os.replace(path + ".tmp", path)

    def cut(self) -> None:
        """The power cut, in place: forget everything not durable (what a new process does)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._load()

    # ---- the current view --------------------------------------------------------------------

    def _lookup(self, path: str) -> Inode:
        node = self.inodes[ROOT_INO]
        for part in path.split("/"):
            if not part:
                continue
            if node.kind != "d":
                raise FsError(errno.ENOTDIR)
            ino = node.entries.get(part)
            if ino is None:
                raise FsError(errno.ENOENT)
            node = self.inodes[ino]
        return node

    def _node(self, path: str | None, fh: int | None) -> Inode:
        if fh:
            node = self.inodes.get(fh)
            if node is not None:
                return node
        if path is None:
            raise FsError(errno.EBADF)
        return self._lookup(path)

    def _parent(self, path: str) -> tuple[Inode, str]:
        head, name = os.path.split(path.rstrip("/"))
        parent = self._lookup(head)
        if parent.kind != "d":
            raise FsError(errno.ENOTDIR)
        return parent, name

    def _new(self, kind: str, mode: int) -> Inode:
        node = Inode(self.next_ino, kind, mode)
        self.next_ino += 1
        self.inodes[node.ino] = node
        return node

    def _drop_link(self, node: Inode) -> None:
        node.nlink -= 1
        node.ctime = time.time_ns()
        self._maybe_free(node)

    def _maybe_free(self, node: Inode) -> None:
        # Forgotten by the view; its object stays while a durable entry names it.
        if node.nlink <= 0 and node.opens <= 0:
            self.inodes.pop(node.ino, None)

    def getattr(self, path, fh=None):
        node = self._node(path, fh)
        kind = stat.S_IFDIR if node.kind == "d" else stat.S_IFREG
        return {"st_mode": kind | (node.mode & 0o7777), "st_ino": node.ino,
                "st_nlink": node.nlink + (1 + sum(self.inodes[i].kind == "d"
                                                  for i in node.entries.values())
                                          if node.kind == "d" else 0),
                "st_size": node.size if node.kind == "f" else 4096,
                "st_blocks": (node.size + 511) // 512, "st_blksize": 4096,
                "st_uid": os.getuid(), "st_gid": os.getgid(),
                "st_atime": node.atime, "st_mtime": node.mtime, "st_ctime": node.ctime}

    def readdir(self, path, fh):
        node = self._lookup(path)
        return [".", "..", *node.entries]

    def mkdir(self, path, mode):
        parent, name = self._parent(path)
        if name in parent.entries:
            raise FsError(errno.EEXIST)
        node = self._new("d", stat.S_IFDIR | mode)
        node.nlink = 1
        parent.entries[name] = node.ino
        parent.mtime = time.time_ns()
        return 0

    def rmdir(self, path):
        parent, name = self._parent(path)
        node = self._lookup(path)
        if node.kind != "d":
            raise FsError(errno.ENOTDIR)
        if node.entries:
            raise FsError(errno.ENOTEMPTY)
        del parent.entries[name]
        self._drop_link(node)
        return 0

    def create(self, path, mode, flags=0):
        parent, name = self._parent(path)
        if name in parent.entries:
            node = self.inodes[parent.entries[name]]
            if flags & os.O_EXCL:
                raise FsError(errno.EEXIST)
        else:
            node = self._new("f", stat.S_IFREG | mode)
            node.nlink = 1
            parent.entries[name] = node.ino
            parent.mtime = time.time_ns()
        node.opens += 1
        return node.ino

    def open(self, path, flags):
        node = self._lookup(path)
        node.opens += 1
        return node.ino

    def opendir(self, path):
        self._lookup(path)
        return 0

    def releasedir(self, path, fh):
        return 0

    def release(self, path, fh):
        node = self.inodes.get(fh)
        if node is not None:
            node.opens -= 1
            self._maybe_free(node)
        return 0

    def flush(self, path, fh):
        return 0

    def unlink(self, path):
        parent, name = self._parent(path)
        node = self._lookup(path)
        if node.kind == "d":
            raise FsError(errno.EISDIR)
        del parent.entries[name]
        parent.mtime = time.time_ns()
        self._drop_link(node)
        return 0

    def rename(self, old, new):
        src_parent, src_name = self._parent(old)
        node = self._lookup(old)
        dst_parent, dst_name = self._parent(new)
        replaced = dst_parent.entries.get(dst_name)
        if replaced == node.ino:
            return 0
        if replaced is not None:
            target = self.inodes[replaced]
            if target.kind == "d":
                if node.kind != "d":
                    raise FsError(errno.EISDIR)
                if target.entries:
                    raise FsError(errno.ENOTEMPTY)
            elif node.kind == "d":
                raise FsError(errno.ENOTDIR)
        del src_parent.entries[src_name]
        dst_parent.entries[dst_name] = node.ino
        src_parent.mtime = dst_parent.mtime = time.time_ns()
        if replaced is not None:
            self._drop_link(self.inodes[replaced])
        return 0

    def link(self, target, source):
        node = self._lookup(source)
        if node.kind == "d":
            raise FsError(errno.EPERM)
        parent, name = self._parent(target)
        if name in parent.entries:
            raise FsError(errno.EEXIST)
        parent.entries[name] = node.ino
        node.nlink += 1
        return 0

    def chmod(self, path, mode):
        node = self._lookup(path)
        node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
        return 0

    def chown(self, path, uid, gid):
        return 0

    def utimens(self, path, times=None):
        node = self._lookup(path)
        if times is None:
            node.atime = node.mtime = time.time_ns()
        else:
            node.atime, node.mtime = (int(t) for t in times)   # nanoseconds (use_ns)
        return 0

    def access(self, path, amode):
        self._lookup(path)
        return 0

    def statfs(self, path):
        st = os.statvfs(self.backing)
        return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree",
                                            "f_bavail", "f_files", "f_ffree", "f_favail",
                                            "f_namemax")}

    # ---- file data ---------------------------------------------------------------------------

    def _page(self, node: Inode, n: int, create: bool) -> bytearray | bytes:
        page = node.dirty.get(n)
        if page is not None:
            return page
        start = n * PAGE
        data = b""
        if start < node.limit:
            data = os.pread(self._fd(node.ino), min(PAGE, node.limit - start), start)
        if not create:
            return data
        page = bytearray(PAGE)
        page[:len(data)] = data
        node.dirty[n] = page
        return page

    def read(self, path, size, offset, fh):
        node = self._node(path, fh)
        end = min(offset + size, node.size)
        out = bytearray()
        pos = offset
        while pos < end:
            n, at = divmod(pos, PAGE)
            take = min(PAGE - at, end - pos)
            chunk = bytes(self._page(node, n, False)[at:at + take])
            out += chunk.ljust(take, b"\0")
            pos += take
        return bytes(out)

    def write(self, path, data, offset, fh):
        node = self._node(path, fh)
        pos, i = offset, 0
        while i < len(data):
            n, at = divmod(pos, PAGE)
            take = min(PAGE - at, len(data) - i)
            self._page(node, n, True)[at:at + take] = data[i:i + take]
            pos += take
            i += take
        node.size = max(node.size, offset + len(data))
        node.mtime = time.time_ns()
        return len(data)

    def truncate(self, path, length, fh=None):
        node = self._node(path, fh)
        if length < node.size:
            last = length // PAGE
            for n in [n for n in node.dirty if n > last or (n == last and length % PAGE == 0)]:
                del node.dirty[n]
            page = node.dirty.get(last)
            if page is not None:
                page[length % PAGE:] = bytes(PAGE - length % PAGE)
            node.limit = min(node.limit, length)
        node.size = length
        node.mtime = time.time_ns()
        return 0

    def fallocate(self, path, mode, offset, length, fh):
        if mode != 0:
            raise FsError(errno.EOPNOTSUPP)
        node = self._node(path, fh)
        node.size = max(node.size, offset + length)
        return 0

    def fsync(self, path, datasync, fh):
        node = self._node(path, fh)
        if node.kind == "d":
            return self.fsyncdir(path, datasync, fh)
        fd = self._fd(node.ino)
        # Bytes past the durable limit are zeros now (a shrink then an extension exposed them).
        os.ftruncate(fd, node.limit)
        for n, page in sorted(node.dirty.items()):
            start = n * PAGE
            if start < node.size:
                os.pwrite(fd, bytes(page[:node.size - start]), start)
        os.ftruncate(fd, node.size)
        node.dirty.clear()
        node.durable_size = node.limit = node.size
        return 0

    def fsyncdir(self, path, datasync, fh):
        node = self._lookup(path) if path is not None else self.inodes[fh]
        self.durable_dirs[node.ino] = dict(node.entries)
        self.durable_inodes.setdefault(node.ino, (node.kind, node.mode))
        for ino in node.entries.values():
            child = self.inodes[ino]
            self.durable_inodes[ino] = (child.kind, child.mode)
            if child.kind == "d":
                self.durable_dirs.setdefault(ino, {})
        self._save_tree()
        return 0


# ---- the process and the mount -----------------------------------------------------------------

def main(argv: list[str]) -> None:
    import mfusepy

    backing, mountpoint = argv[1], argv[2]
    fs = LazyFS(backing)

    class Ops(mfusepy.Operations):
        use_ns = True

    def wrap(name):
        method = getattr(fs, name)

        def call(self, *args):
            try:
                return method(*args)
            except FsError as e:
                raise mfusepy.FuseOSError(e.errno) from None
        call.__name__ = name
        return call

    for name in ("getattr", "readdir", "mkdir", "rmdir", "create", "open", "opendir",
                 "releasedir", "release", "flush", "unlink", "rename", "link", "chmod", "chown",
                 "utimens", "access", "statfs", "read", "write", "truncate", "fallocate",
                 "fsync", "fsyncdir"):
        setattr(Ops, name, wrap(name))
    # hard_remove: an unlinked open file is dropped, not renamed to .fuse_hidden (which would be
    # a rename this file system would have to make durable). One thread: the model has no locks.
    mfusepy.FUSE(Ops(), mountpoint, foreground=True, nothreads=True, hard_remove=True,
                 fsname="lazyfs")


class LazyMount:
    """A mount of ``LazyFS``: ``mount()``, ``cut()`` (SIGKILL the file system and unmount: what
    was not synced is gone) and ``mount()`` again over the same backing directory."""

    def __init__(self, backing: str, mountpoint: str):
        self.backing, self.mountpoint = backing, mountpoint
        self.proc: subprocess.Popen | None = None
        os.makedirs(backing, exist_ok=True)
        os.makedirs(mountpoint, exist_ok=True)

    def mount(self, timeout: float = 20.0) -> None:
        log = open(os.path.join(os.path.dirname(self.backing.rstrip("/")) or ".",
                                "lazyfs.log"), "ab")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.backing,
                                      self.mountpoint], stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lazyfs did not mount {self.mountpoint} "
                                   f"(exit {self.proc.poll()}); see lazyfs.log")
            time.sleep(0.02)

    def _unmount(self) -> None:
        subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], capture_output=True)

    def cut(self) -> None:
        """The power cut: the file system dies with everything it held unsynced."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None
        self._unmount()

    def unmount(self) -> None:
        """A clean stop (nothing unsynced is kept either: this file system has no write-back)."""
        self.cut()


def available() -> str | None:
    """Why a mount cannot work here, or None: the tests fail with this line, never skip."""
    import shutil
    if not os.path.exists("/dev/fuse"):
        return "the power-cut tests need FUSE: no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "the power-cut tests need Debian's fuse3 (fusermount3): apt-get install fuse3"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        return f"the power-cut tests need mfusepy over libfuse3: {e}"
    return None


if __name__ == "__main__":
    main(sys.argv)
