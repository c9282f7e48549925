"""A capture as recorded: raw counter values per PM sample, the counters' peaks and where they came from.

This is what ``smlens profile --json`` writes under ``capture`` and what the test fixtures hold, so the
analysis can be re-run on any capture without a GPU. No CUPTI here.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smlens.errors import SmlensError
from smlens.files import read_bounded
from smlens.profile.counters import PEAK_OF, REQUIRED

FORMAT = "smlens-profile/1"
# Room for the --json file of the longest capture (600 s at 10 kHz: six million samples of ten numbers),
# compressed or not; a larger file is no recording (/dev/zero, a log given by mistake) and gets one
# sentence instead of filling the memory.
MAX_BYTES = 2 << 30
WHAT = "profile recording"


class RecordingError(SmlensError):
    """A recording that cannot be read; the message is one sentence for the user."""


@dataclass
class Recording:
    gpu: Mapping[str, Any]  # index, uuid, name
    chip: str
    interval_ns: int
    counters: Sequence[str]
    peaks: Mapping[str, float]  # counter -> peak per elapsed cycle, from CUPTI
    start_ns: np.ndarray  # int64, GPU global timer
    end_ns: np.ndarray
    values: np.ndarray  # float64, samples x counters
    notes: dict[str, Any] = field(default_factory=dict)  # decode statistics, overflow...

    def column(self, counter: str) -> np.ndarray:
        return np.asarray(self.values[:, list(self.counters).index(counter)])

    def __len__(self) -> int:
        return len(self.start_ns)

    def to_json(self) -> dict[str, Any]:
        rows = [
            [int(s), int(e), *(float(v) for v in row)]
            for s, e, row in zip(self.start_ns, self.end_ns, self.values, strict=True)
        ]
        return {
            "format": FORMAT,
            "gpu": dict(self.gpu),
            "chip": self.chip,
            "interval_ns": self.interval_ns,
            "counters": list(self.counters),
            "peaks": dict(self.peaks),
            "notes": self.notes,
            "samples": rows,
        }

    @staticmethod
    def from_json(data: Any) -> Recording:
        try:
            if data.get("format") != FORMAT:
                raise RecordingError(f"not a smlens profile recording (format {data.get('format')!r})")
            counters = [str(c) for c in data["counters"]]
            missing = [c for c in REQUIRED if c not in counters] + [
                c for c in PEAK_OF if (c in REQUIRED or c in counters) and c not in data["peaks"]
            ]
            if missing:
                raise RecordingError(f"the recording lacks {', '.join(missing)}")
            peaks = {str(k): float(v) for k, v in data["peaks"].items()}
            for name, peak in peaks.items():
                if not (math.isfinite(peak) and peak > 0):
                    raise RecordingError(f"the peak of {name} is {peak}, not a positive number")
            rows = np.asarray(data["samples"], dtype=np.float64).reshape(-1, 2 + len(counters))
            stamps = np.asarray([r[:2] for r in data["samples"]], dtype=np.int64).reshape(-1, 2)
            backwards = np.flatnonzero(stamps[:, 1] < stamps[:, 0])
            if backwards.size:
                raise RecordingError(f"sample {backwards[0]} ends before it starts")
            # Each sample carries its own stamps, so a file out of time order loses nothing by sorting.
            order = np.argsort(stamps[:, 0], kind="stable")
            return Recording(
                gpu=dict(data.get("gpu", {})),
                chip=str(data["chip"]),
                interval_ns=int(data["interval_ns"]),
                counters=counters,
                peaks=peaks,
                start_ns=stamps[order, 0],
                end_ns=stamps[order, 1],
                values=rows[order, 2:],
                notes=dict(data.get("notes", {})),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, RecordingError):
                raise
            raise RecordingError(f"the recording is malformed ({exc})") from None

    @staticmethod
    def load(path: Path) -> Recording:
        raw = read_bounded(path, WHAT, MAX_BYTES)
        try:
            if path.suffix == ".gz":
                with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
                    raw = f.read(MAX_BYTES + 1)
                if len(raw) > MAX_BYTES:
                    raise RecordingError(
                        f"{WHAT} {path} holds more than {MAX_BYTES >> 20} MiB once decompressed"
                    )
            data = json.loads(raw)
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RecordingError(f"cannot read {path}: {exc}") from None
        return Recording.from_json(data.get("capture", data) if isinstance(data, dict) else data)
