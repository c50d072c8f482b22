"""A FUSE filesystem that loses, when the test says so, every write that was never fsynced.

A crash test that kills a process (kill -9, os._exit) proves nothing about fsync: the
kernel keeps what the process wrote and a restart reads it back. Only a power loss throws
the page cache away, and only what an fsync made durable is still there afterwards. This
module simulates that for one directory tree, so a test can check that the broker's store
confirms nothing it has not made durable, and that it recovers from exactly what was.

Use (the FUSE server is a subprocess: the broker subprocesses and the test all go through
the same mount)::

    with powerloss_mount(tmp_path) as fs:         # mounted at fs.path, served from fs.backing
        run_a_writer_on(fs.path / "data")         # a subprocess; it dies (kill -9, os._exit)
        report = fs.power_loss()                  # everything not durable is gone
        assert report["files_reverted"] >= 1     # the premise: something was lost
        restart_on(fs.path / "data")             # sees the durable state only
    # unmounted here, also when the test failed; fs.backing now holds the final tree

From another process: ``request(address, "power_loss")`` with ``fs.address``, or
``python tests/support/powerloss.py power-loss ADDRESS``.

What is durable (the strict reading of POSIX, stricter than ext4, so that a missing fsync
shows up as a loss here rather than in production):

* A regular file's contents and size: what they were at the last fsync or fdatasync of
  that file (through any descriptor of it, read-only ones included). Writes, ftruncate,
  fallocate (which may grow the file) and hole punching since then are volatile.
* A directory's entries (create, mknod, mkdir, symlink, link, unlink, rmdir, rename into
  or out of it): what they were at the last fsync of that directory. Each directory
  counts alone: fsyncing a file does not make its name durable, fsyncing a directory
  does not make its own name in its parent durable, and a rename between two directories
  needs both fsynced (with only the source fsynced the file is lost, with only the
  target it has two names). A new directory's durable entries start empty. A directory
  that would come back under two names (a rename of a directory across directories with
  only the target fsynced) comes back under the first one found.
* The state at mount time (the backing directory's tree) is durable.
* Not simulated: mode, owner and times take effect at once and survive a power loss;
  sync(2) and syncfs(2) never reach a FUSE server, so they make nothing durable here.

`power_loss()` reverts every file to its durable contents and size and every directory
to its durable entries; what is no longer reachable from the root is gone. The server
keeps serving: processes started afterwards see the durable state. Descriptors opened
before the power loss belong to processes that a real power loss would have killed: reads,
writes, fstat and fsync on them fail with EIO, so a writer should be dead before the test
pulls the plug. Unmounting is a clean shutdown: the backing directory then holds the current tree
(every file written back, as umount would), readable without the mount; while mounted it
is the server's own (the durable contents kept in ``.powerloss-store``).

Volatile file contents live in the server's memory as pages over the durable contents in
the backing store; an fsync writes the file's dirty pages there. The kernel caches no names
and no attributes, and its page cache writes through (no writeback cache: a write has
reached the server when the call returns; a store into a shared mmap when the kernel writes
the page back, at msync, fsync or close, as anywhere). It never serves a page the power
loss took away: it asks for a file's attributes before every read (where a descriptor from
before the power loss fails), drops the file's cached pages when it is opened, and drops
them too when its mtime changed, which a power loss does to every file it reverts. Not
bypassing the page cache (direct_io) keeps shared mmap working: SQLite's WAL index, the
broker's definitions store, needs it. Locks (flock, fcntl) are the kernel's own, as on any
FUSE filesystem that does not implement them. A file unlinked while open keeps a hidden name
(libfuse's ``.fuse_hidden…``, which libfuse's path-based API needs to serve fstat on it)
that no listing shows and no power loss brings back, as if it had no name at all.

The FUSE binding is mfusepy (ctypes over Debian's libfuse3, nothing to compile); the
server runs single-threaded, so no two operations ever interleave.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import functools
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "FuseUnavailable",
    "PowerLossMount",
    "powerloss_mount",
    "request",
    "unavailable",
]

#: Granularity of the volatile layer: a write copies at most one page from the durable
#: contents underneath it, an fsync writes whole dirty pages.
PAGE = 64 << 10
#: Where, inside the backing directory, the durable contents live while mounted.
STORE = ".powerloss-store"
#: The server's exit status when the machine cannot mount FUSE (not our bug).
EXIT_UNAVAILABLE = 4
#: ...and when one of its operations raised something other than OSError (our bug).
EXIT_INTERNAL_ERROR = 3
#: libfuse renames a file unlinked while open to such a name, and unlinks it at the close.
HIDDEN_PREFIX = ".fuse_hidden"

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def _error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


# ------------------------------------------------------------------ the model


class Node:
    """One inode. `links` counts its names in the current tree, `dlinks` its names in the
    durable entries of directories, `opens` its open handles: at zero, zero and zero it
    can never come back and its durable contents are deleted."""

    __slots__ = ("ino", "mode", "uid", "gid", "atime", "mtime", "ctime", "links", "dlinks", "opens")

    def __init__(self, ino: int, mode: int, uid: int, gid: int) -> None:
        now = time.time_ns()
        self.ino, self.mode, self.uid, self.gid = ino, mode, uid, gid
        self.atime = self.mtime = self.ctime = now
        self.links = self.dlinks = self.opens = 0

    def touch(self) -> None:
        self.mtime = self.ctime = time.time_ns()

    @property
    def size(self) -> int:
        return 0


class Dir(Node):
    """`entries` is the tree as processes see it; `durable` what survives a power loss."""

    __slots__ = ("entries", "durable", "parent")

    def __init__(self, ino: int, mode: int, uid: int, gid: int) -> None:
        super().__init__(ino, mode, uid, gid)
        self.entries: dict[str, Node] = {}
        self.durable: dict[str, Node] = {}
        self.parent: Dir | None = None

    @property
    def size(self) -> int:
        return 4096


class Symlink(Node):
    __slots__ = ("target",)

    def __init__(self, ino: int, mode: int, uid: int, gid: int, target: str) -> None:
        super().__init__(ino, mode, uid, gid)
        self.target = target

    @property
    def size(self) -> int:
        return len(os.fsencode(self.target))


class File(Node):
    """A regular file: durable contents in the store file, volatile pages over them.

    The current contents are, page by page, `pages[i]` where present, else the store
    file's bytes below `base_limit`, else zeros; `size` cuts them. `base_limit` is the
    durable size lowered by every truncation since the last fsync, so that a file cut and
    grown again reads zeros, not what the cut removed. Invariants: base_limit <= size and
    base_limit <= durable_size; page bytes past `size` are zero.
    """

    __slots__ = ("store", "fd", "_size", "durable_size", "base_limit", "pages")

    def __init__(self, ino: int, mode: int, uid: int, gid: int, store: str, size: int = 0):
        super().__init__(ino, mode, uid, gid)
        self.store = store
        self.fd: int | None = None
        self._size = self.durable_size = self.base_limit = size
        self.pages: dict[int, bytearray] = {}

    @property
    def size(self) -> int:
        return self._size

    @property
    def dirty(self) -> bool:
        return bool(self.pages) or self._size != self.durable_size or self.base_limit != self._size

    def _store_fd(self) -> int:
        if self.fd is None:
            self.fd = os.open(self.store, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self.fd

    def _base(self, start: int, stop: int) -> bytes:
        limit = min(stop, self.base_limit)
        if start >= limit:
            return bytes(stop - start)
        data = os.pread(self._store_fd(), limit - start, start)
        short = stop - start - len(data)
        return data + bytes(short) if short else data

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self._size)
        if offset >= end:
            return b""
        if not self.pages:
            return self._base(offset, end)
        parts: list[bytes | bytearray] = []
        pos = offset
        while pos < end:
            index = pos // PAGE
            stop = min((index + 1) * PAGE, end)
            page = self.pages.get(index)
            if page is not None:
                parts.append(page[pos - index * PAGE : stop - index * PAGE])
            else:  # a run of pages not in memory: one pread
                while stop < end and stop // PAGE not in self.pages:
                    stop = min(stop + PAGE, end)
                parts.append(self._base(pos, stop))
            pos = stop
        return b"".join(parts)

    def write(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        view = memoryview(data)
        pos = offset
        while pos < end:
            index = pos // PAGE
            first = index * PAGE
            stop = min(first + PAGE, end)
            page = self.pages.get(index)
            if page is None:
                if pos == first and stop == first + PAGE:  # a whole page: nothing to keep
                    self.pages[index] = bytearray(view[pos - offset : stop - offset])
                    pos = stop
                    continue
                page = bytearray(self._base(first, first + PAGE))
                self.pages[index] = page
            page[pos - first : stop - first] = view[pos - offset : stop - offset]
            pos = stop
        if end > self._size:
            self._size = end

    def truncate(self, size: int) -> None:
        if size < self._size:
            for index in [i for i in self.pages if i * PAGE >= size]:
                del self.pages[index]
            page = self.pages.get(size // PAGE)
            if page is not None:
                cut = size % PAGE
                page[cut:] = bytes(PAGE - cut)
            self.base_limit = min(self.base_limit, size)
        self._size = size

    def zero(self, offset: int, length: int) -> None:
        """Zero a range inside the file (hole punching, FALLOC_FL_ZERO_RANGE)."""
        end = min(offset + length, self._size)
        while offset < end:
            stop = min((offset // PAGE + 1) * PAGE, end)
            self.write(offset, bytes(stop - offset))
            offset = stop

    def sync(self) -> bool:
        """fsync/fdatasync: the current contents become the durable ones. Whether there
        was anything to write."""
        if not self.dirty:
            return False
        fd = self._store_fd()
        if self.base_limit < self.durable_size:
            os.ftruncate(fd, self.base_limit)  # what a truncation removed stays removed
        run: list[bytearray] = []
        run_start = next_index = -1
        for index in sorted(self.pages):
            if index != next_index and run:
                os.pwrite(fd, b"".join(run), run_start * PAGE)
                run = []
            if not run:
                run_start = index
            page = self.pages[index]
            tail = self._size - index * PAGE
            run.append(page if tail >= PAGE else page[:tail])
            next_index = index + 1
        if run:
            os.pwrite(fd, b"".join(run), run_start * PAGE)
        os.ftruncate(fd, self._size)
        self.pages = {}
        self.durable_size = self.base_limit = self._size
        return True

    def revert(self) -> None:
        self.pages = {}
        self._size = self.base_limit = self.durable_size

    def drop_store(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.store)


class Handle:
    __slots__ = ("node", "epoch")

    def __init__(self, node: Node, epoch: int) -> None:
        self.node, self.epoch = node, epoch


F = TypeVar("F", bound=Callable[..., Any])


def _operation(method: F) -> F:
    """One operation at a time (FUSE and the control socket), and anything but an OSError
    is our bug: counted, its traceback logged, EIO to the caller."""

    @functools.wraps(method)
    def locked(self: Model, *args: Any) -> Any:
        with self.lock:
            if self.closed:
                raise _error(errno.EIO)
            try:
                return method(self, *args)
            except OSError:
                raise
            except Exception:
                self.counters["internal_errors"] += 1
                traceback.print_exc()
                sys.stderr.flush()
                raise _error(errno.EIO) from None

    return locked  # type: ignore[return-value]


class Model:
    """The filesystem without FUSE: the current and the durable tree, and the power loss.

    Paths are absolute within the mount ("/a/b"); symlinks in them were already resolved
    by the kernel. File handles are plain ints.
    """

    def __init__(self, backing: str) -> None:
        self.backing = os.path.abspath(backing)
        self.store = os.path.join(self.backing, STORE)
        self.lock = threading.Lock()
        self.closed = False
        self.epoch = 0
        self.nodes: dict[int, Node] = {}  # every node that is, or may come back
        self.handles: dict[int, Handle] = {}
        # Files unlinked while open, by the hidden path libfuse still names them with: in no
        # directory (neither listed nor ever durable), still reachable for fstat.
        self.hidden: dict[str, Node] = {}
        self._next_ino = 1
        self._next_fh = 1
        self.counters = dict.fromkeys(
            (
                "writes",
                "bytes_written",
                "fsync",
                "fdatasync",
                "fsyncdir",
                "fallocate",
                "truncate",
                "power_losses",
                "internal_errors",
            ),
            0,
        )
        self.root = self._import()

    # ---------------------------------------------------------------- nodes

    def _new(self, cls: type[Node], mode: int, uid: int, gid: int, *extra: Any) -> Any:
        ino = self._next_ino
        self._next_ino += 1
        if cls is File:
            node: Node = File(ino, mode, uid, gid, os.path.join(self.store, str(ino)), *extra)
        else:
            node = cls(ino, mode, uid, gid, *extra)
        self.nodes[ino] = node
        return node

    def _forget_if_gone(self, node: Node) -> None:
        """Delete what nothing can reach any more, now or after a power loss."""
        if node.links or node.dlinks or node.opens or self.nodes.get(node.ino) is not node:
            return
        del self.nodes[node.ino]
        if isinstance(node, File):
            node.drop_store()
        elif isinstance(node, Dir):
            for child in node.durable.values():
                child.dlinks -= 1
                self._forget_if_gone(child)
            node.durable = {}

    def _lookup(self, path: str) -> Node:
        hidden = self.hidden.get(path)
        if hidden is not None:
            return hidden
        node: Node = self.root
        for part in path.split("/"):
            if not part:
                continue
            if not isinstance(node, Dir):
                raise _error(errno.ENOTDIR)
            child = node.entries.get(part)
            if child is None:
                raise _error(errno.ENOENT)
            node = child
        return node

    def _parent(self, path: str) -> tuple[Dir, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head)
        if not isinstance(parent, Dir):
            raise _error(errno.ENOTDIR)
        if not name:
            raise _error(errno.EBUSY)  # the root itself
        return parent, name

    def _handle(self, fh: int) -> Handle:
        handle = self.handles.get(fh)
        if handle is None:
            raise _error(errno.EBADF)
        if handle.epoch != self.epoch:
            raise _error(errno.EIO)  # opened before the power loss
        return handle

    def _node(self, path: str | None, fh: int | None) -> Node:
        if fh:
            return self._handle(fh).node
        if path is None:
            raise _error(errno.ENOENT)
        return self._lookup(path)

    def _file(self, fh: int) -> File:
        node = self._handle(fh).node
        if not isinstance(node, File):
            raise _error(errno.EISDIR)
        return node

    def _open(self, node: Node) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = Handle(node, self.epoch)
        node.opens += 1
        return fh

    def _link(self, parent: Dir, name: str, node: Node) -> None:
        parent.entries[name] = node
        node.links += 1
        if isinstance(node, Dir):
            node.parent = parent
        parent.touch()

    def _unlink(self, parent: Dir, name: str) -> Node:
        node = parent.entries.pop(name)
        node.links -= 1
        node.ctime = time.time_ns()
        parent.touch()
        return node

    # ---------------------------------------------------------------- attributes

    @_operation
    def getattr(self, path: str | None, fh: int | None) -> dict[str, int]:
        node = self._node(path, fh)
        if isinstance(node, Dir):
            nlink = 2 + sum(isinstance(c, Dir) for c in node.entries.values())
        else:
            nlink = node.links
        size = node.size
        return {
            "st_mode": node.mode,
            "st_ino": node.ino,
            "st_nlink": nlink,
            "st_uid": node.uid,
            "st_gid": node.gid,
            "st_size": size,
            "st_blocks": (size + 511) // 512,
            "st_blksize": 4096,
            "st_atime": node.atime,
            "st_mtime": node.mtime,
            "st_ctime": node.ctime,
        }

    @_operation
    def chmod(self, path: str | None, mode: int) -> None:
        node = self._node(path, None)
        node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(mode)
        node.ctime = time.time_ns()

    @_operation
    def chown(self, path: str | None, uid: int, gid: int) -> None:
        node = self._node(path, None)
        if uid != -1:
            node.uid = uid
        if gid != -1:
            node.gid = gid
        node.ctime = time.time_ns()

    @_operation
    def utimens(self, path: str | None, times: tuple[int, int] | None) -> None:
        node = self._node(path, None)
        now = time.time_ns()
        node.atime, node.mtime = times if times else (now, now)
        node.ctime = now

    @_operation
    def readlink(self, path: str) -> str:
        node = self._lookup(path)
        if not isinstance(node, Symlink):
            raise _error(errno.EINVAL)
        return node.target

    @_operation
    def statfs(self) -> dict[str, int]:
        st = os.statvfs(self.backing)
        return {
            key: getattr(st, key)
            for key in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_namemax",
            )
        }

    @_operation
    def access(self, path: str) -> None:
        self._lookup(path)

    # ---------------------------------------------------------------- the tree

    def _create_node(self, path: str, cls: type[Node], mode: int, uid: int, gid: int, *extra):
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _error(errno.EEXIST)
        node = self._new(cls, mode, uid, gid, *extra)
        self._link(parent, name, node)
        return node

    @_operation
    def create(self, path: str, mode: int, flags: int, uid: int, gid: int) -> int:
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is not None:
            if flags & os.O_EXCL:
                raise _error(errno.EEXIST)
            if not isinstance(node, File):
                raise _error(errno.EISDIR)
            if flags & os.O_TRUNC:
                node.truncate(0)
                node.touch()
        else:
            node = self._create_node(path, File, stat.S_IFREG | stat.S_IMODE(mode), uid, gid)
        return self._open(node)

    @_operation
    def mknod(self, path: str, mode: int, uid: int, gid: int) -> None:
        if not stat.S_ISREG(mode):
            raise _error(errno.EPERM)  # regular files only: nothing here needs more
        self._create_node(path, File, mode, uid, gid)

    @_operation
    def mkdir(self, path: str, mode: int, uid: int, gid: int) -> None:
        self._create_node(path, Dir, stat.S_IFDIR | stat.S_IMODE(mode), uid, gid)

    @_operation
    def symlink(self, path: str, target: str, uid: int, gid: int) -> None:
        self._create_node(path, Symlink, stat.S_IFLNK | 0o777, uid, gid, target)

    @_operation
    def link(self, path: str, existing: str) -> None:
        node = self._lookup(existing)
        if isinstance(node, Dir):
            raise _error(errno.EPERM)
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _error(errno.EEXIST)
        self._link(parent, name, node)
        node.ctime = time.time_ns()

    @_operation
    def unlink(self, path: str) -> None:
        hidden = self.hidden.pop(path, None)
        if hidden is not None:  # closed at last
            self._forget_if_gone(hidden)
            return
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            raise _error(errno.ENOENT)
        if isinstance(node, Dir):
            raise _error(errno.EISDIR)
        self._unlink(parent, name)
        self._forget_if_gone(node)

    @_operation
    def rmdir(self, path: str) -> None:
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            raise _error(errno.ENOENT)
        if not isinstance(node, Dir):
            raise _error(errno.ENOTDIR)
        if node.entries:
            raise _error(errno.ENOTEMPTY)
        self._unlink(parent, name)
        node.parent = None
        self._forget_if_gone(node)

    @_operation
    def rename(self, old: str, new: str, flags: int) -> None:
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == (
            RENAME_NOREPLACE | RENAME_EXCHANGE
        ):
            raise _error(errno.EINVAL)
        src, src_name = self._parent(old)
        node = src.entries.get(src_name)
        if node is None:
            raise _error(errno.ENOENT)
        dst, dst_name = self._parent(new)
        if dst_name.startswith(HIDDEN_PREFIX) and not flags and not isinstance(node, Dir):
            self._unlink(src, src_name)  # libfuse's unlink of an open file
            self.hidden[new] = node
            return
        target = dst.entries.get(dst_name)
        if isinstance(node, Dir):  # not into itself or below
            ancestor: Dir | None = dst
            while ancestor is not None:
                if ancestor is node:
                    raise _error(errno.EINVAL)
                ancestor = ancestor.parent
        if flags & RENAME_EXCHANGE:
            if target is None:
                raise _error(errno.ENOENT)
            if isinstance(target, Dir):
                ancestor = src
                while ancestor is not None:
                    if ancestor is target:
                        raise _error(errno.EINVAL)
                    ancestor = ancestor.parent
            self._unlink(src, src_name)
            self._unlink(dst, dst_name)
            self._link(dst, dst_name, node)
            self._link(src, src_name, target)
            return
        if target is node:
            return  # two names of one file: POSIX says do nothing
        if target is not None:
            if flags & RENAME_NOREPLACE:
                raise _error(errno.EEXIST)
            if isinstance(node, Dir):
                if not isinstance(target, Dir):
                    raise _error(errno.ENOTDIR)
                if target.entries:
                    raise _error(errno.ENOTEMPTY)
            elif isinstance(target, Dir):
                raise _error(errno.EISDIR)
            self._unlink(dst, dst_name)
            if isinstance(target, Dir):
                target.parent = None
        self._unlink(src, src_name)
        self._link(dst, dst_name, node)
        node.ctime = time.time_ns()
        if target is not None:
            self._forget_if_gone(target)

    # ---------------------------------------------------------------- files

    @_operation
    def open(self, path: str, flags: int) -> int:
        node = self._lookup(path)
        if isinstance(node, Dir):
            raise _error(errno.EISDIR)
        if flags & os.O_TRUNC and isinstance(node, File):
            node.truncate(0)
            node.touch()
        return self._open(node)

    @_operation
    def read(self, fh: int, size: int, offset: int) -> bytes:
        return self._file(fh).read(offset, size)

    @_operation
    def write(self, fh: int, data: bytes, offset: int) -> int:
        node = self._file(fh)
        node.write(offset, data)
        node.touch()
        self.counters["writes"] += 1
        self.counters["bytes_written"] += len(data)
        return len(data)

    @_operation
    def truncate(self, path: str | None, fh: int | None, size: int) -> None:
        node = self._node(path, fh)
        if not isinstance(node, File):
            raise _error(errno.EISDIR if isinstance(node, Dir) else errno.EINVAL)
        node.truncate(size)
        node.touch()
        self.counters["truncate"] += 1

    @_operation
    def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        node = self._file(fh)
        if mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            raise _error(errno.EOPNOTSUPP)
        if mode & FALLOC_FL_PUNCH_HOLE and not mode & FALLOC_FL_KEEP_SIZE:
            raise _error(errno.EOPNOTSUPP)
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            node.zero(offset, length)
        if not mode & FALLOC_FL_KEEP_SIZE and offset + length > node.size:
            node.truncate(offset + length)  # the allocated space reads as zeros
        node.touch()
        self.counters["fallocate"] += 1

    @_operation
    def fsync(self, fh: int, datasync: int) -> None:
        node = self._handle(fh).node
        if isinstance(node, File):
            node.sync()
        self.counters["fdatasync" if datasync else "fsync"] += 1

    @_operation
    def release(self, fh: int) -> None:
        handle = self.handles.pop(fh, None)
        if handle is not None and handle.epoch == self.epoch:
            handle.node.opens -= 1
            self._forget_if_gone(handle.node)

    # ---------------------------------------------------------------- directories

    @_operation
    def opendir(self, path: str) -> int:
        node = self._lookup(path)
        if not isinstance(node, Dir):
            raise _error(errno.ENOTDIR)
        return self._open(node)

    @_operation
    def readdir(self, fh: int) -> list[tuple[str, dict[str, int], int]]:
        node = self._handle(fh).node
        assert isinstance(node, Dir)
        parent = node.parent or node
        listing = [(".", node), ("..", parent), *node.entries.items()]
        return [(name, {"st_mode": n.mode, "st_ino": n.ino}, 0) for name, n in listing]

    @_operation
    def fsyncdir(self, fh: int) -> None:
        node = self._handle(fh).node
        assert isinstance(node, Dir)
        old, node.durable = node.durable, dict(node.entries)
        for child in node.durable.values():
            child.dlinks += 1
        for child in old.values():
            child.dlinks -= 1
            self._forget_if_gone(child)
        self.counters["fsyncdir"] += 1

    # ---------------------------------------------------------------- power

    @_operation
    def power_loss(self) -> dict[str, int]:
        """Throw away everything volatile: the durable tree becomes the tree."""
        alive = {ino for ino, node in self.nodes.items() if node.links}
        for node in self.nodes.values():
            node.links = node.dlinks = node.opens = 0
        report = {"files_reverted": 0, "dirs_reverted": 0, "nodes_lost": 0}
        reached = {self.root.ino}
        self.root.links = self.root.dlinks = 1
        self.root.parent = None
        stack = [self.root]
        while stack:
            directory = stack.pop()
            if directory.entries != directory.durable:
                report["dirs_reverted"] += 1
            for name, child in list(directory.durable.items()):
                if isinstance(child, Dir):
                    if child.ino in reached:  # a second name for a directory: see above
                        del directory.durable[name]
                        continue
                    child.parent = directory
                    stack.append(child)
                reached.add(child.ino)
                child.links += 1
                child.dlinks += 1
            directory.entries = dict(directory.durable)
        for ino, node in list(self.nodes.items()):
            if ino in reached:
                if isinstance(node, File) and node.dirty:
                    report["files_reverted"] += 1
                    node.revert()
                    node.touch()  # a new mtime: the kernel drops what it cached of it
            else:
                report["nodes_lost"] += ino in alive
                del self.nodes[ino]
                if isinstance(node, File):
                    node.drop_store()
        self.hidden.clear()
        self.epoch += 1
        self.counters["power_losses"] += 1
        return report

    @_operation
    def stats(self) -> dict[str, int]:
        return {**self.counters, "epoch": self.epoch}

    # ---------------------------------------------------------------- backing directory

    def _import(self) -> Dir:
        """The backing directory's tree, durable as it stands: files are hard-linked into
        the store (same filesystem), so nothing is copied."""
        shutil.rmtree(self.store, ignore_errors=True)
        os.mkdir(self.store)
        st = os.lstat(self.backing)
        root = self._new(Dir, st.st_mode, st.st_uid, st.st_gid)
        root.links = root.dlinks = 1
        seen: dict[tuple[int, int], File] = {}

        def walk(path: str, directory: Dir) -> None:
            with os.scandir(path) as entries:
                for entry in entries:
                    if directory is root and entry.name == STORE:
                        continue
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        child: Node = self._new(Dir, st.st_mode, st.st_uid, st.st_gid)
                        child.parent = directory  # type: ignore[attr-defined]
                        walk(entry.path, child)  # type: ignore[arg-type]
                    elif stat.S_ISREG(st.st_mode):
                        key = (st.st_dev, st.st_ino)
                        if key in seen:
                            child = seen[key]
                        else:
                            child = seen[key] = self._new(
                                File, st.st_mode, st.st_uid, st.st_gid, st.st_size
                            )
                            os.link(entry.path, child.store)  # type: ignore[attr-defined]
                    elif stat.S_ISLNK(st.st_mode):
                        child = self._new(
                            Symlink, st.st_mode, st.st_uid, st.st_gid, os.readlink(entry.path)
                        )
                    else:
                        continue  # sockets, fifos, devices: nothing here makes them
                    child.atime, child.mtime, child.ctime = (
                        st.st_atime_ns,
                        st.st_mtime_ns,
                        st.st_ctime_ns,
                    )
                    directory.entries[entry.name] = child
                    child.links += 1
                    child.dlinks += 1
            directory.durable = dict(directory.entries)

        walk(self.backing, root)
        return root

    def export(self) -> None:
        """Unmounted cleanly: write every file back and lay the current tree out in the
        backing directory (hard links stay hard links), then drop the store."""
        with self.lock:
            self.closed = True
            for name in os.listdir(self.backing):
                if name != STORE:
                    path = os.path.join(self.backing, name)
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
            written: dict[int, str] = {}

            def lay_out(directory: Dir, path: str) -> None:
                for name, node in directory.entries.items():
                    target = os.path.join(path, name)
                    if isinstance(node, Dir):
                        os.mkdir(target)
                        lay_out(node, target)
                    elif isinstance(node, Symlink):
                        os.symlink(node.target, target)
                        continue
                    elif isinstance(node, File):
                        if node.ino in written:
                            os.link(written[node.ino], target)
                            continue
                        node.sync()
                        node._store_fd()  # a file never written still needs its store file
                        os.link(node.store, target)
                        written[node.ino] = target
                    os.chmod(target, stat.S_IMODE(node.mode))
                    os.utime(target, ns=(node.atime, node.mtime))

            lay_out(self.root, self.backing)
            for node in self.nodes.values():
                if isinstance(node, File) and node.fd is not None:
                    os.close(node.fd)
                    node.fd = None
            shutil.rmtree(self.store, ignore_errors=True)


# ------------------------------------------------------------------ the server


def _control_address(address: str) -> str:
    """An address starting with "@" is in Linux's abstract socket namespace: no path to
    clean up or to outgrow the 108 bytes of sun_path. Anything else is a path."""
    return "\0" + address[1:] if address.startswith("@") else address


def _control_loop(model: Model, listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # shut down at unmount
        with conn:
            try:
                command = conn.makefile("rb").readline().decode().strip()
                if command == "power_loss":
                    reply: dict[str, Any] = model.power_loss()
                elif command == "stats":
                    reply = model.stats()
                else:
                    reply = {"error": f"unknown command {command!r}"}
            except OSError as exc:
                reply = {"error": str(exc)}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(reply).encode() + b"\n")


def serve(backing: str, mountpoint: str, address: str) -> int:
    """Mount, serve until unmounted, lay the tree out in `backing`. The exit status."""
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        print(f"powerloss: cannot open /dev/fuse: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    # mfusepy looks for libfuse2 first; this filesystem is written against libfuse3.
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    import mfusepy

    model = Model(backing)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(_control_address(address))
    listener.listen(16)
    threading.Thread(target=_control_loop, args=(model, listener), daemon=True).start()
    mounted = threading.Event()

    def caller() -> tuple[int, int]:
        uid, gid, _ = mfusepy.fuse_get_context()
        return uid, gid

    def text(path: bytes | None, fuse: Any) -> str | None:
        return None if path is None else path.decode(fuse.encoding, fuse.errors)

    class Operations(mfusepy.Operations):  # type: ignore[misc]
        """The FUSE face of `model`: translation only."""

        use_ns = True

        def init_with_config(self, conn: Any, config: Any) -> None:
            if config is not None:
                # No caching of names or attributes, and cached pages dropped at every
                # open: after a power loss the kernel must ask again, and see the durable
                # state (the module's docstring says why not direct_io).
                config.entry_timeout = config.negative_timeout = config.attr_timeout = 0.0
                config.direct_io = 0
                config.kernel_cache = config.auto_cache = 0
                # Operations on an open file come by handle, with no path (with
                # hard_remove, an fstat of an unlinked open file would fail with ESTALE:
                # the kernel asks by inode and libfuse has no path to give; see `hidden`).
                config.hard_remove = 0
                config.nullpath_ok = 1
                config.use_ino = 1
            mounted.set()

        def getattr(self, path, fh=None):
            return model.getattr(path, fh)

        def access(self, path, amode):
            return model.access(path)

        def chmod(self, path, mode):
            return model.chmod(path, mode)

        def chown(self, path, uid, gid):
            return model.chown(path, uid, gid)

        def utimens(self, path, times=None):
            return model.utimens(path, times)

        def readlink(self, path):
            return model.readlink(path)

        def statfs(self, path):
            return model.statfs()

        def create(self, path, mode, flags):
            return model.create(path, mode, flags, *caller())

        def mknod(self, path, mode, dev):
            return model.mknod(path, mode, *caller())

        def mkdir(self, path, mode):
            return model.mkdir(path, mode, *caller())

        def symlink(self, target, source):
            return model.symlink(target, source, *caller())

        def link(self, target, source):
            return model.link(target, source)

        def unlink(self, path):
            return model.unlink(path)

        def rmdir(self, path):
            return model.rmdir(path)

        def rename(self, old, new, flags=0):
            return model.rename(old, new, flags)

        def open(self, path, flags):
            return model.open(path, flags)

        def read(self, path, size, offset, fh):
            return model.read(fh, size, offset)

        def write(self, path, data, offset, fh):
            return model.write(fh, data, offset)

        def truncate(self, path, length, fh=None):
            return model.truncate(path, fh, length)

        def fallocate(self, path, mode, offset, size, fh):
            return model.fallocate(fh, mode, offset, size)

        def flush(self, path, fh):
            return 0

        def fsync(self, path, datasync, fh):
            return model.fsync(fh, datasync)

        def release(self, path, fh):
            return model.release(fh)

        def opendir(self, path):
            return model.opendir(path)

        def readdir(self, path, fh):
            return model.readdir(fh)

        def releasedir(self, path, fh):
            return model.release(fh)

        def fsyncdir(self, path, datasync, fh):
            return model.fsyncdir(fh)

    class Fuse(mfusepy.FUSE):  # type: ignore[misc]
        """mfusepy drops rename's flags (RENAME_NOREPLACE would silently replace) and
        ftruncate's handle (an unlinked open file could not be cut): pass both on."""

        def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
            return self.operations.rename(text(old, self), text(new, self), flags)

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            fh = fip.contents.fh if fip else None
            return self.operations.truncate(text(path, self), length, fh)

    try:
        Fuse(
            Operations(),
            mountpoint,
            foreground=True,
            nothreads=True,
            fsname="powerloss",
            subtype="powerloss",
            entry_timeout=0,
            negative_timeout=0,
            attr_timeout=0,
        )
    except RuntimeError as exc:  # libfuse's fuse_main returned non-zero
        if not mounted.is_set():
            print(f"powerloss: mounting failed ({exc})", file=sys.stderr)
            return EXIT_UNAVAILABLE
        # Stopped by SIGTERM after a lazy unmount: its own unmount then fails. The tree
        # is still ours to lay out.
        print(f"powerloss: libfuse ended with status {exc}", file=sys.stderr)
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
    model.export()
    return EXIT_INTERNAL_ERROR if model.counters["internal_errors"] else 0


# ------------------------------------------------------------------ the test's side


class FuseUnavailable(Exception):
    """The machine cannot mount FUSE. `provided_by` names the environment variable by
    which `make test` says it should have been able to (tests/machine.py)."""

    def __init__(self, why: str, provided_by: str) -> None:
        super().__init__(why)
        self.provided_by = provided_by


def unavailable() -> FuseUnavailable | None:
    """Why FUSE cannot be mounted here, or None when it should work."""
    if not os.path.exists("/dev/fuse"):
        return FuseUnavailable("no /dev/fuse here (the fuse kernel module)", "ROARMQ_EXPECT_FUSE")
    if ctypes.util.find_library("fuse3") is None:
        return FuseUnavailable(
            "libfuse3 is not installed (Debian's fuse3; `make system-deps` installs it)",
            "ROARMQ_EXPECT_PACKAGES",
        )
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return FuseUnavailable(
            "fusermount3 is not installed (Debian's fuse3; `make system-deps` installs it)",
            "ROARMQ_EXPECT_PACKAGES",
        )
    return None


def request(address: str, command: str, timeout: float = 30.0) -> dict[str, Any]:
    """Send `command` ("power_loss" or "stats") to the server at `address`; its reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(_control_address(address))
        sock.sendall(command.encode() + b"\n")
        data = sock.makefile("rb").readline()
    reply = json.loads(data)
    if "error" in reply:
        raise RuntimeError(f"powerloss {command}: {reply['error']}")
    return reply


def _unescape(field: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash as \\ooo."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _is_mounted(mountpoint: str) -> bool:
    """Read from the mount table: a stat of the mount point would ask the server."""
    with open("/proc/self/mountinfo") as table:
        return any(_unescape(line.split()[4]) == mountpoint for line in table)


class PowerLossMount:
    """A mounted powerloss filesystem: `path` to use, `power_loss()` to pull the plug."""

    def __init__(self, path: Path, backing: Path, address: str, log: Path) -> None:
        self.path = path
        self.backing = backing
        self.address = address
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def power_loss(self) -> dict[str, int]:
        """Lose everything not durable. What was lost: `files_reverted` (files whose
        contents or size went back), `dirs_reverted`, `nodes_lost` (files, directories and
        symlinks that existed and are gone)."""
        return request(self.address, "power_loss")

    def stats(self) -> dict[str, int]:
        """Operation counts since mounting: writes, bytes_written, fsync, fdatasync,
        fsyncdir, fallocate, truncate, power_losses, internal_errors; and the epoch."""
        return request(self.address, "stats")

    def _mount(self, timeout: float) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, "serve", str(self.backing), str(self.path)]
                + [self.address],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not _is_mounted(str(self.path)):
            code = self.process.poll()
            if code == EXIT_UNAVAILABLE:
                raise FuseUnavailable(self._log_tail(), "ROARMQ_EXPECT_FUSE")
            if code is not None:
                raise RuntimeError(f"powerloss server exited {code}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"powerloss: not mounted after {timeout} s: {self._log_tail()}")
            time.sleep(0.01)
        os.stat(self.path)  # answered once the server has replied to the kernel's INIT

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:].strip()
        except OSError:
            return ""

    def _unmount(self) -> str | None:
        """Unmount and wait for the server to lay the tree out and exit. What went wrong,
        or None.

        A process still using the mount (a broker the test did not stop) keeps a plain
        unmount busy: after a few seconds the mount is detached lazily and the server told
        to stop (SIGTERM: it leaves its loop, lays out the tree and exits), which leaves
        that process with a dead connection rather than the test with a hung one."""
        plain, lazy = (
            (["fusermount3", "-u"], ["fusermount3", "-u", "-z"])
            if shutil.which("fusermount3")
            else (["umount"], ["umount", "-l"])
        )
        target = str(self.path)
        problem = None
        deadline = time.monotonic() + 5
        while _is_mounted(target):
            if subprocess.run(plain + [target], capture_output=True).returncode == 0:
                break
            if time.monotonic() > deadline:
                subprocess.run(lazy + [target], capture_output=True)
                problem = "still in use 5 s after the test (detached): a process left running?"
                if self.process is not None:
                    self.process.terminate()
                break
            time.sleep(0.05)
        if self.process is None:
            return problem
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            if _is_mounted(target):
                subprocess.run(lazy + [target], capture_output=True)
            return problem or "the server did not exit within 30 s of the unmount: killed"
        if code != 0:
            return problem or f"the server exited {code}: {self._log_tail()}"
        return problem


@contextlib.contextmanager
def powerloss_mount(
    base: str | os.PathLike[str],
    *,
    backing: str | os.PathLike[str] | None = None,
    timeout: float = 15.0,
) -> Iterator[PowerLossMount]:
    """Mount a powerloss filesystem at `base`/mnt over `backing` (default `base`/backing,
    created if missing, its tree taken as durable), served by a subprocess that logs to
    `base`/powerloss.log. Unmounted on the way out, whatever happened; on a normal way out,
    raises if the server failed (an operation hit a bug: see the log).

    Raises FuseUnavailable when the machine cannot mount FUSE."""
    base = Path(base)
    why = unavailable()
    if why is not None:
        raise why
    backing = Path(backing) if backing is not None else base / "backing"
    mountpoint = base / "mnt"
    backing.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    fs = PowerLossMount(
        Path(os.path.realpath(mountpoint)),
        backing,
        f"@roarmq-powerloss-{os.getpid()}-{secrets.token_hex(6)}",
        base / "powerloss.log",
    )
    try:
        fs._mount(timeout)
        yield fs
    except BaseException:
        fs._unmount()
        raise
    problem = fs._unmount()
    if problem is not None:
        raise RuntimeError(f"powerloss at {fs.path}: {problem}")


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "serve":
        return serve(*argv[1:])
    if len(argv) == 2 and argv[0] in ("power-loss", "stats"):
        print(json.dumps(request(argv[1], argv[0].replace("-", "_"))))
        return 0
    print(
        "usage: powerloss.py serve BACKING MOUNTPOINT ADDRESS | power-loss ADDRESS | stats ADDRESS",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
