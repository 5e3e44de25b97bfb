"""Whole files or nothing: every result, summary and generated file is written through here. And a results
folder's one writer: `holding(DIR)` while a sweep writes it, `held(DIR)` to ask whether one still does. And a full
disk named as such (`DiskFull`, `disk_full`, `describe_disk`), with room kept back for the last word
(`reserving`)."""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpt2bench import conventions


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write a whole file or nothing: a crash leaves the old file (or none), never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are for sharing
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, DiskFull) and disk_full(exc):
            raise DiskFull(path, exc) from None  # one error naming the file and its disk, not three chained
        raise


DEFAULT_TERMINATION_LOG = Path(conventions.DEFAULT_TERMINATION_LOG)


def termination_log_path() -> Path | None:
    """$GPT2BENCH_TERMINATION_LOG, else /dev/termination-log when it exists (in a pod), else nowhere."""
    configured = os.environ.get(conventions.TERMINATION_LOG_ENV)
    if configured:
        return Path(configured)
    return DEFAULT_TERMINATION_LOG if DEFAULT_TERMINATION_LOG.exists() else None


def write_termination_message(path: Path, text: str) -> None:
    """Atomically where we can (a regular file's folder), in place for /dev/termination-log itself."""
    data = text.encode()[: conventions.MAX_TERMINATION_MESSAGE]
    try:
        write_atomic(path, data)
    except OSError:  # /dev not writable, or the kubelet's bind-mounted file cannot be replaced
        path.write_bytes(data)


# ------------------------------------------------------------------ a folder's one writer
class FolderBusy(OSError):
    """Another live process holds the folder (`holding`)."""


@contextmanager
def holding(directory: str | os.PathLike) -> Iterator[None]:
    """Hold `directory` for this process while the block runs: an exclusive flock on the folder itself, taken
    without waiting (FolderBusy when another process has it). The kernel lets go when the process ends, however it
    ends (SIGKILL included), so a folder nobody holds has no live writer. The descriptor is not inherited: a child
    left running does not hold it. Where the file system has no flock (some network ones), nothing is held."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderBusy(f"{directory} is being written by another process") from None
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # and with it the lock


def held(directory: str | os.PathLike) -> bool:
    """Whether a live process holds `directory` (`holding`); False when it does not exist or cannot be asked."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


# ------------------------------------------------------------------ a full disk
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # no space left; the user's disk quota exceeded


class DiskFull(OSError):
    """A write failed because the file system holding `path` is full (or its quota spent); the message names the
    file, the file system (mount point, type, free space) and the OS's words."""

    def __init__(self, path: str | os.PathLike, cause: OSError | None = None):
        self.path = Path(path)
        code = cause.errno if cause is not None and cause.errno in DISK_FULL_ERRNOS else errno.ENOSPC
        words = os.strerror(code)
        super().__init__(code, f"cannot write {self.path}: {words}: {describe_disk(self.path)} is full")
        self.filename = str(self.path)

    def __str__(self) -> str:
        return self.args[1]


def disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, is a full disk (ENOSPC, EDQUOT)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _mounts() -> list[tuple[str, str, str]]:
    """(device, mount point, type) of every mount, from /proc/self/mounts (Linux); [] elsewhere."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3:  # octal escapes (\040 for a space) as the kernel writes them
            found.append((fields[0], fields[1].encode().decode("unicode_escape"), fields[2]))
    return found


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def describe_disk(path: str | os.PathLike) -> str:
    """The file system holding `path`, in words: `the disk mounted at /data (ext4 /dev/sdb1: 0 B free of 64.0 GiB)`
    (the nearest existing folder is asked; on a system without /proc/self/mounts, its folder alone)."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    real = os.path.realpath(where)
    mounts = [m for m in _mounts() if real == m[1] or real.startswith(m[1].rstrip("/") + "/")]
    try:
        stat = os.statvfs(real)
        space = f"{_size(stat.f_bavail * stat.f_frsize)} free of {_size(stat.f_blocks * stat.f_frsize)}"
    except OSError:
        space = "free space unknown"
    if not mounts:
        return f"the disk holding {real} ({space})"
    device, mount, kind = max(mounts, key=lambda m: len(m[1]))
    return f"the disk mounted at {mount} ({kind} {device}: {space})"


RESERVE_FILE = ".gpt2bench-reserve"
RESERVE_BYTES = 4 << 20  # room for results.json's last word when the disk fills (a 100-run document is ~400 KiB)


@contextmanager
def reserving(directory: str | os.PathLike, size: int = RESERVE_BYTES) -> Iterator[Path]:
    """Keep `size` bytes of `directory`'s disk back while the block runs (a file of that size, really allocated), so
    that once the disk fills, `release(directory)` frees enough for the results to be written consistently. A disk
    that cannot spare it raises DiskFull now, before anything is run. The file goes at the end."""
    path = Path(directory) / RESERVE_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:  # pragma: no cover (not Linux)
                os.write(fd, b"\0" * size)
        finally:
            os.close(fd)
    except OSError as exc:
        path.unlink(missing_ok=True)
        if disk_full(exc):
            raise DiskFull(path, exc) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate keeps nothing back
            raise
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def release(directory: str | os.PathLike) -> bool:
    """Free the room `reserving` kept back in `directory`; whether there was any."""
    path = Path(directory) / RESERVE_FILE
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
