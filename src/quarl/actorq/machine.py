"""What an ActorQ run measures of the machine it ran on: its energy and CO2 (codecarbon),
the CPU seconds every process kept it busy, and what it is (CPU, cores, GPU)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from quarl.actorq.summary import Energy, MachineInfo

log = logging.getLogger(__name__)


def start_energy(out: Path) -> Any:
    """codecarbon's tracker, started; None where it is not available."""
    try:
        from codecarbon import OfflineEmissionsTracker

        logging.getLogger("codecarbon").setLevel(logging.ERROR)

        tracker = OfflineEmissionsTracker(country_iso_code=os.environ.get("QUARL_COUNTRY", "USA"), output_dir=str(out),
                                          log_level="error", save_to_file=False, measure_power_secs=5)
        tracker.start()
        return tracker
    except Exception as exc:  # energy is a report, never a reason to stop training
        log.warning("energy tracking unavailable: %s", exc)
        return None


def stop_energy(tracker: Any) -> Energy:
    """The summary's ``energy`` (JSON): measured or estimated, or ``available: False``."""
    if tracker is None:
        return {"available": False}
    try:
        kg = tracker.stop()
        data = tracker.final_emissions_data
        rapl = any(Path("/sys/class/powercap").glob("intel-rapl:*/energy_uj"))
        readable = rapl and all(os.access(p, os.R_OK)
                                for p in Path("/sys/class/powercap").glob("intel-rapl:*/energy_uj"))
        return {
            "available": True,
            "energy_kwh": float(data.energy_consumed),
            "cpu_energy_kwh": float(data.cpu_energy),
            "ram_energy_kwh": float(data.ram_energy),
            "co2_kg": float(kg or 0.0),
            "country": data.country_iso_code,
            "method": "measured (RAPL)" if readable else "estimated (codecarbon: CPU TDP x load, RAM by size)",
        }
    except Exception as exc:
        log.warning("energy tracking failed: %s", exc)
        return {"available": False, "error": str(exc)}


def machine_busy_s() -> float:
    """CPU seconds this machine has been busy since boot, all cores and processes."""
    import psutil

    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))


def describe_machine() -> MachineInfo:
    """The summary's ``machine`` (JSON): CPU model, cores, GPU."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
