"""What Linux's /proc says of a process's or a thread's signals (tests of core/signals.py and the SDK's thread)."""

from __future__ import annotations

from pathlib import Path


def _mask(status: Path, field: str) -> set[int]:
    for line in status.read_text().splitlines():
        if line.startswith(f"{field}:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError(f"no {field} line in {status}")


def blocked_signals(native_id: int) -> set[int]:
    """The signals a thread of this process blocks (its ``SigBlk`` mask)."""
    return _mask(Path(f"/proc/self/task/{native_id}/status"), "SigBlk")


def ignored_signals(pid: int) -> set[int]:
    """The signals process ``pid`` ignores (its ``SigIgn`` mask)."""
    return _mask(Path(f"/proc/{pid}/status"), "SigIgn")


def process_blocked_signals(pid: int) -> set[int]:
    """The signals the main thread of process ``pid`` blocks (its ``SigBlk`` mask)."""
    return _mask(Path(f"/proc/{pid}/status"), "SigBlk")
