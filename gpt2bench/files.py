"""Whole files or nothing: every result, summary and generated file is written through here. And a results
folder's one writer: `holding(DIR)` while a sweep writes it, `held(DIR)` to ask whether one still does."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpt2bench import protocol


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
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


DEFAULT_TERMINATION_LOG = Path(protocol.DEFAULT_TERMINATION_LOG)


def termination_log_path() -> Path | None:
    """$GPT2BENCH_TERMINATION_LOG, else /dev/termination-log when it exists (in a pod), else nowhere."""
    configured = os.environ.get(protocol.TERMINATION_LOG_ENV)
    if configured:
        return Path(configured)
    return DEFAULT_TERMINATION_LOG if DEFAULT_TERMINATION_LOG.exists() else None


def write_termination_message(path: Path, text: str) -> None:
    """Atomically where we can (a regular file's folder), in place for /dev/termination-log itself."""
    data = text.encode()[: protocol.MAX_TERMINATION_MESSAGE]
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
