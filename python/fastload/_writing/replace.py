"""Putting a finished dataset directory in place, atomically for readers.

A first write renames the temporary directory to `path` with RENAME_NOREPLACE (never over a
directory that appeared meanwhile). An overwrite swaps the two directories in one step with
renameat2(RENAME_EXCHANGE): at every instant `path` holds the old dataset or the new one, a
reader never finds it missing, a kill at any point leaves one of them there, and concurrent
overwriters each swap their own directory in (the last one wins) and delete what they swapped
out. Where the system lacks renameat2 or the filesystem refuses the exchange (some network
filesystems), it falls back to two renames, and a later write puts back a dataset that a kill
between them left hidden.

Leftovers of writers that died (`.<name>.tmp-<host>-<pid>-<random>` beside `path`) are deleted by
the next write to the same path, on the same host, once their process is gone.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import secrets
import shutil
import socket
from typing import Any

from .._sources.manifest import FORMAT, MANIFEST

_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100
_OLD = ".old"


def _load_renameat2() -> Any:
    try:
        f = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    f.restype = ctypes.c_int
    return f


_renameat2 = _load_renameat2()


class Unsupported(Exception):
    """renameat2 (or the flag asked) is not available for these paths."""


def rename2(src: str, dst: str, flags: int) -> None:
    """renameat2(src, dst, flags); OSError as os.rename raises it, Unsupported where the system
    or the filesystem lacks it."""
    if _renameat2 is None:
        raise Unsupported()
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        raise Unsupported()
    raise OSError(err, os.strerror(err), src, None, dst)


def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def temporary_name(parent: str, base: str) -> str:
    return os.path.join(parent, f".{base}.tmp-{_host_tag()}-{os.getpid()}-{secrets.token_hex(4)}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def is_dataset(path: str) -> bool:
    """A directory (not a symlink) whose manifest.json says it is a fastload dataset."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    mpath = os.path.join(path, MANIFEST)
    try:
        fd = os.open(mpath, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        import stat  # noqa: PLC0415

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            head = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return False
    finally:
        os.close(fd)
    return isinstance(head, dict) and head.get("format") == FORMAT


def check_replaceable(path: str) -> None:
    """Refuses to replace anything at `path` but a fastload dataset directory: overwrite=True on a
    typo, '.', a home directory or a file must not delete the user's files."""
    cwd = os.path.realpath(os.getcwd())
    real = os.path.realpath(path)
    if cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        raise ValueError(f"refusing to replace {path}: it is the current working directory or contains it")
    if not os.path.lexists(path):
        return
    if os.path.islink(path):
        raise ValueError(f"refusing to replace {path}: it is a symbolic link (write to the directory it points to)")
    if not os.path.isdir(path):
        raise ValueError(f"refusing to replace {path}: it is a file, not a fastload dataset directory; "
                         "overwrite=True only replaces a dataset")
    if not is_dataset(path):
        raise ValueError(f"refusing to replace {path}: it is not a fastload dataset directory (no readable "
                         f"{MANIFEST} of format {FORMAT!r}); overwrite=True only replaces a dataset, "
                         "delete it yourself if it must go")


def clean_leftovers(parent: str, base: str, path: str) -> None:
    """Deletes what writers of `path` on this host left when they died; first puts back a dataset
    that the two-rename fallback left hidden with nothing at `path`."""
    prefix = f".{base}.tmp-{_host_tag()}-"
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in sorted(names):
        if not name.startswith(prefix):
            continue
        try:
            pid = int(name[len(prefix):].split("-", 1)[0])
        except ValueError:
            continue
        if pid == os.getpid() or _pid_alive(pid):
            continue
        full = os.path.join(parent, name)
        if name.endswith(_OLD) and not os.path.lexists(path) and is_dataset(full):
            try:
                os.rename(full, path)  # the dataset an interrupted overwrite hid: back in place
                continue
            except OSError:
                pass
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: str, path: str, overwrite: bool, fsync: bool) -> None:
    """Moves the finished directory `tmp` to `path` (see the module docstring)."""
    parent = os.path.dirname(path)
    swapped_out = None
    while True:
        if overwrite and os.path.lexists(path):
            check_replaceable(path)
            try:
                rename2(tmp, path, _RENAME_EXCHANGE)
                swapped_out = tmp  # now holds the old dataset
                if not is_dataset(tmp):  # something else took its place after the check: put it back
                    rename2(tmp, path, _RENAME_EXCHANGE)
                    _refuse(path)
                break
            except FileNotFoundError:
                continue  # deleted meanwhile: place ours as a first write
            except Unsupported:
                swapped_out = _two_renames(tmp, path)
                break
        try:
            rename2(tmp, path, _RENAME_NOREPLACE)
            break
        except FileExistsError:
            if not overwrite:
                raise FileExistsError(f"{path} appeared while writing; the new dataset is discarded") from None
            continue  # another writer placed one meanwhile: swap ours in
        except Unsupported:
            if os.path.lexists(path):
                if not overwrite:
                    raise FileExistsError(f"{path} appeared while writing; the new dataset is discarded") from None
                check_replaceable(path)
                swapped_out = _two_renames(tmp, path)
            else:
                os.rename(tmp, path)
            break
    if fsync:
        _fsync_dir(parent)
    if swapped_out is not None:
        shutil.rmtree(swapped_out, ignore_errors=True)


def _two_renames(tmp: str, path: str) -> str:
    """The fallback: the old dataset aside (as `<tmp>.old`, put back by the next write if a kill
    comes before the second rename), the new one in."""
    old = tmp + _OLD
    os.rename(path, old)
    if not is_dataset(old):  # something else took its place after the check: put it back
        os.rename(old, path)
        _refuse(path)
    try:
        os.rename(tmp, path)
    except OSError:
        os.rename(old, path)
        raise
    return old


def _refuse(path: str) -> None:
    """Raises check_replaceable's ValueError for what is at `path` now (not a dataset)."""
    check_replaceable(path)
    raise ValueError(f"refusing to replace {path}: it was replaced by something that is not a fastload dataset "
                     "while the new dataset was being put in place")
