"""The channel between a law search's driver and its tasks (cases/running/search.py): files in a folder the
driver makes. Each task writes how many examples it has checked so far (the progress display), and the
driver writes one file that tells every task to stop (``--fail-fast``). Files, not a queue: they reach a
task run in this process and one in a local pool's worker alike, with no change to the pool. A task on
another node (a Ray cluster) cannot reach the folder: it shows only its start and its end.

What is read back here is shown, never judged: a verdict comes from the task's own report, returned
through cases/running/pool.py. A file that is not a regular file of two numbers is ignored, so a kernel
that writes into the folder (it runs as the same user) can change what the display says, not the verdict,
and a stop it forges only stops the search (its laws are then not held).
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["Channel", "TaskChannel", "watch"]

_STOP = "stop"
#: A task writes its count at most this often (seconds): a file per example would cost the fast laws time.
WRITE_EVERY_S = 0.2


def _name(law: str, task: int) -> str:
    return f"{law}.{task}"


class Channel:
    """The driver's side: the folder (made private to this user), what each task last wrote, the stop."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="pfa-verify-search-")

    def checked(self, law: str, task: int) -> tuple[int, float] | None:
        """``(examples, seconds)`` task ``task`` of ``law`` last wrote, or None (nothing yet, or not two numbers)."""
        try:
            fd = os.open(os.path.join(self.folder, _name(law, task)), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):      # a FIFO would block the reader for ever
                return None
            words = os.read(fd, 64).split()
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            examples, seconds = int(words[0]), float(words[1])
        except (IndexError, ValueError):
            return None
        return (examples, seconds) if examples >= 0 and seconds >= 0 else None

    def stop(self) -> None:
        """Tell every task to stop: one not started returns at once, one running after its current example."""
        with open(os.path.join(self.folder, _STOP), "w"):
            pass

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class TaskChannel:
    """A task's side: whether the driver said stop, and the count of examples checked (at most every
    :data:`WRITE_EVERY_S` seconds, and the first at once). A folder it cannot reach (another node) is
    silent: no count, no stop."""

    def __init__(self, folder: str, law: str, task: int) -> None:
        self.path = os.path.join(folder, _name(law, task))
        self.stop_path = os.path.join(folder, _STOP)
        self.written = 0.0

    def stopped(self) -> bool:
        return os.path.exists(self.stop_path)

    def checked(self, examples: int, seconds: float) -> None:
        now = time.perf_counter()
        if examples > 1 and now - self.written < WRITE_EVERY_S:
            return
        self.written = now
        try:
            with open(self.path + ".new", "w") as f:
                f.write(f"{examples} {seconds:.3f}\n")
            os.replace(self.path + ".new", self.path)      # whole, or not at all: the reader never sees half
        except OSError:
            pass


def watch(channel: Channel, running: Callable[[], Iterable[tuple[str, int]]],
          report: Callable[[str, int, int, float], None], every_s: float = 0.5) -> Callable[[], None]:
    """Start a thread that reads the count of every task ``running()`` names every ``every_s`` seconds and
    calls ``report(law, task, examples, seconds)`` when it changed; returns the function that stops it."""
    done = threading.Event()
    seen: dict = {}

    def loop() -> None:
        while not done.wait(every_s):
            for law, task in list(running()):
                now = channel.checked(law, task)
                if now is not None and seen.get((law, task)) != now:
                    seen[(law, task)] = now
                    report(law, task, *now)

    thread = threading.Thread(target=loop, name="pfa-verify search progress", daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join()
    return stop
