"""How numbers and durations are written in summaries and reports."""

from __future__ import annotations

import math
import time
from decimal import Decimal


def format_number(value: float | None, fmt: str, missing: str = "-") -> str:
    """``value`` in ``fmt`` (a format spec), or ``missing`` when it is None."""
    return missing if value is None else format(value, fmt)


# The widest number a cell shows in fixed point: a real run's figures (steps, tokens/s, losses)
# take at most about 15 characters with separators; a corrupt or hostile record's (a loss of
# -1e308, a step of 1e20) would take hundreds and push every other column off the screen.
FIXED_WIDTH = 15


def format_bounded(value: float | None, spec: str, missing: str = "-") -> str:
    """``value`` in ``spec`` (:func:`format_number`), or in scientific notation with three
    significant digits (``-1.00e+308``) when that would be wider than :data:`FIXED_WIDTH`
    characters (an int past a float's range too: Decimal formats it)."""
    text = format_number(value, spec, missing)
    if value is None or len(text) <= FIXED_WIDTH:
        return text
    return format(Decimal(value), ".2e")


def format_count(n: int) -> str:
    """A count with a short scale: ``1.50B`` (billions, 2 decimals), ``5.0M``, ``12.3K``, or the
    number itself below a thousand."""
    for scale, suffix, digits in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f}{suffix}"
    return str(n)


def counted(n: int, noun: str) -> str:
    """``n`` with separators and ``noun``, plural unless ``n`` is 1: ``1 run``,
    ``1,234 runs``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def format_size(n_bytes: float) -> str:
    """A size in decimal units with 3 significant digits: ``2.1 GB``, ``45.3 MB``, ``812 kB``,
    ``96 B``."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} B"


def format_duration(seconds: float | None) -> str:
    """Seconds as ``42s``, ``3m05s`` or ``2h03m05s``, units written out (``-`` when None, NaN or
    infinite)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    minutes, s = divmod(int(round(seconds)), 60)
    hours, m = divmod(minutes, 60)
    if hours:
        return f"{hours}h{m:02d}m{s:02d}s"
    return f"{m}m{s:02d}s" if minutes else f"{s}s"


def format_amount(value: float) -> str:
    """A total (GPU-hours, energy, cost): whole with thousands separators from 100 up, else 3
    significant digits without an exponent (``0.256``, ``0.00000171``; never ``0`` for a
    positive amount)."""
    if abs(value) >= 100 or value == 0:
        return f"{value:,.0f}"
    return f"{value:.{2 - math.floor(math.log10(abs(value)))}f}"


def format_span(seconds: float) -> str:
    """A planned span of time in its largest unit: days from one up (``12.5 d``), hours from
    one up (``3.25 h``), minutes from one up (``47.9 min``), else seconds (``28.1 s``)."""
    for scale, unit, digits in ((86400, "d", 1), (3600, "h", 2), (60, "min", 1)):
        if seconds >= scale:
            return f"{seconds / scale:,.{digits}f} {unit}"
    return f"{seconds:.3g} s"


def format_flops_rate(flops_per_s: float) -> str:
    """A rate in FLOP/s, 4 significant digits, in TFLOP/s from 1 TFLOP/s up and in GFLOP/s
    below (a CPU's peak is not ``0.0 TFLOP/s``): ``989.5 TFLOP/s``, ``76.8 GFLOP/s``."""
    scale, unit = (1e12, "TFLOP/s") if abs(flops_per_s) >= 1e12 else (1e9, "GFLOP/s")
    return f"{flops_per_s / scale:,.4g} {unit}"


def peak_label(flops: float | None, kind: str | None, devices: list[str], count: int | None) -> str:
    """What an MFU divides by, per device: ``NVIDIA H200: 989.5 TFLOP/s per device
    (datasheet_dense_bfloat16)`` from the run's peak ``flops`` (FLOP/s, all its devices: an MFU
    event's ``peak_flops``), the peak's ``kind`` and the run's device kinds and ``count``
    (``run_start``'s ``env``); ``<device kind>: peak unknown`` when the record names no peak."""
    device = ", ".join(devices) or "device kind unknown"
    if not flops or not count or not math.isfinite(flops):
        return f"{device}: peak unknown"
    per_device = format_flops_rate(flops / count)
    return f"{device}: {per_device} per device ({kind or 'kind unknown'})"


def format_clock(
    epoch_s: float | None, fmt: str = "%Y-%m-%d %H:%M:%S", *, utc: bool = False
) -> str:
    """A Unix time (seconds) as local (or UTC) clock time in ``fmt`` for ``time.strftime``;
    ``-`` when None or outside what the platform's calendar holds (NaN, 1e20: a record's time
    is read as written, and a reader must not crash on it)."""
    if epoch_s is None:
        return "-"
    try:
        return time.strftime(fmt, time.gmtime(epoch_s) if utc else time.localtime(epoch_s))
    except (OverflowError, OSError, ValueError):
        return "-"
