"""Node system sampler: ~1 Hz CPU, RAM and per-GPU samples into ``system.jsonl``.

GPU metrics come from NVML (nvidia-ml-py) when it is installed and finds
devices; on a CPU-only node the ``gpus`` list is empty.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from traceml_tui.core import atomic, records
from traceml_tui.core.signals import shielded


class _Nvml:
    def __init__(self) -> None:
        self.handles: list[Any] = []
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no NVML, no driver or no GPU: CPU-only samples
            self.nvml = None

    def sample(self) -> list[records.GpuSample]:
        out = []
        nvml = self.nvml
        for index, handle in enumerate(self.handles):
            gpu = records.GpuSample(index=index)
            try:
                gpu.util_pct = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpu.mem_used, gpu.mem_total = int(memory.used), int(memory.total)
                gpu.temp_c = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
                gpu.power_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except Exception:  # noqa: BLE001 - a field a device does not support stays null
                pass
            out.append(gpu)
        return out


class SystemSampler:
    """Background thread appending one :class:`records.SystemSample` per interval."""

    def __init__(self, path: Path, run_name: str, node_rank: int, interval_s: float = 1.0) -> None:
        self.path = path
        self.run_name = run_name
        self.node_rank = node_rank
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="traceml-system-sampler", daemon=True)
        with shielded():  # (core/signals.py: a signal sent to the launcher goes to the main thread)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil is a dependency
            return
        fd = atomic.open_append(self.path)
        try:
            header = records.Header(
                v=records.RECORD_VERSION, run=self.run_name, rank=-1, attempt=0, uuid=uuid.uuid4().hex,
                ts=time.time(), node_rank=self.node_rank, stream="system",
            )
            atomic.append_line(fd, records.encode(header))
            nvml = _Nvml()
            psutil.cpu_percent(None)  # prime: the first call has no interval to measure
            while not self._stop.wait(self.interval_s):
                memory = psutil.virtual_memory()
                sample = records.SystemSample(
                    v=records.RECORD_VERSION, run=self.run_name, node_rank=self.node_rank, ts=time.time(),
                    cpu_pct=psutil.cpu_percent(None), ram_used=int(memory.total - memory.available),
                    ram_total=int(memory.total), gpus=nvml.sample(),
                )
                atomic.append_line(fd, records.encode(sample))
        finally:
            import os

            os.close(fd)
