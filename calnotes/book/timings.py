"""How long a chapter takes to rerun, measured when the book was last built and tested.

Two measurements, both taken by the build itself (nothing typed): the time each page took
to execute at SMOKE size under nbval (the test-suite's JUnit report, one test case a
cell) and at the book's own parameters when Jupyter Book executed it (its execution
cache, a SQLite database whose records keep ``execution_seconds``). ``python
tools/chapter_times.py`` reads both after ``make test`` and ``make book`` and writes them,
with the machine and the commit they were measured on, to ``TIMES_PATH``; a chapter's
"In this chapter" box reads its own row with ``rerun_glue``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import sqlite3
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calnotes._io import atomic_write
from calnotes.book.chapters import BOOK_DIR

__all__ = ["TIMES_PATH", "book_times_from_cache", "load_times", "rerun_glue",
           "smoke_times_from_junit", "write_times"]

#: Where the measured times are kept (committed beside the chapters).
TIMES_PATH = BOOK_DIR / "chapter_times.json"
#: Largest report read back (a JUnit report of the book's cells is a few hundred kB).
MAX_REPORT_BYTES = 64 * 2**20
_STEM = re.compile(r"([A-Za-z0-9_]+?)(?:-\d{8}-\d{6})?\.ipynb")


def _stem_of(text: str) -> str | None:
    """The page stem (``"02_diagnosing_miscalibration"``) named in a notebook path or a
    test id, or ``None``."""
    match = _STEM.search(text)
    return match.group(1) if match else None


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: seconds must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{where}: seconds must be finite and >= 0, got {value!r}")
    return float(value)


def smoke_times_from_junit(path: str | os.PathLike) -> dict[str, float]:
    """``{page stem: seconds}``: the nbval cells' times of a JUnit XML report summed per
    notebook (a cell's test case names its notebook in ``classname`` or ``file``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"junit report {path}: no such file")
    if path.stat().st_size > MAX_REPORT_BYTES:
        raise ValueError(f"junit report {path}: larger than {MAX_REPORT_BYTES} bytes")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise ValueError(f"junit report {path}: not XML ({err})") from None
    times: dict[str, float] = {}
    for case in root.iter("testcase"):
        stem = _stem_of(" ".join(case.get(k, "") for k in ("file", "classname", "name")))
        if stem is not None:
            seconds = _seconds(float(case.get("time", "nan")), f"junit report {path}")
            times[stem] = times.get(stem, 0.0) + seconds
    if not times:
        raise ValueError(f"junit report {path}: no notebook cell among its test cases")
    return times


def book_times_from_cache(cache_dir: str | os.PathLike) -> dict[str, float]:
    """``{page stem: seconds}`` of Jupyter Book's execution cache (``global.db``); the
    latest record of a page counts."""
    db = Path(cache_dir) / "global.db"
    if not db.is_file():
        raise ValueError(f"execution cache {db}: no such file (build the book first)")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT uri, data FROM nbcache ORDER BY created").fetchall()
    except sqlite3.DatabaseError as err:
        raise ValueError(f"execution cache {db}: unreadable ({err})") from None
    finally:
        con.close()
    times: dict[str, float] = {}
    for uri, data in rows:
        stem = Path(str(uri)).stem
        try:
            record = json.loads(data) if isinstance(data, str) else (data or {})
        except json.JSONDecodeError:
            raise ValueError(f"execution cache {db}: a record of {uri} is not JSON") from None
        if isinstance(record, dict) and "execution_seconds" in record:
            times[stem] = _seconds(record["execution_seconds"], f"execution cache {db}")
    if not times:
        raise ValueError(f"execution cache {db}: no executed page recorded")
    return times


def write_times(smoke: Mapping[str, float], book: Mapping[str, float],
                machine: Mapping[str, Any], path: str | os.PathLike = TIMES_PATH) -> Path:
    """Write both measurements with the machine and commit they come from, atomically."""
    pages = sorted(set(smoke) | set(book))
    data = {
        "measured_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"),
        "machine": dict(machine),
        "pages": {p: {"smoke_seconds": smoke.get(p), "book_seconds": book.get(p)}
                  for p in pages},
    }
    path = Path(path)
    atomic_write(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    return path


def load_times(path: str | os.PathLike = TIMES_PATH) -> dict[str, Any]:
    """The stored times, checked: ``{"measured_utc", "machine", "pages"}``. A missing file
    gives ``{}`` (nothing measured yet); a malformed one a ``ValueError`` naming it."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"chapter times {path}: not JSON ({err})") from None
    if not (isinstance(data, dict) and isinstance(data.get("pages"), dict)
            and isinstance(data.get("machine"), dict)
            and isinstance(data.get("measured_utc"), str)):
        raise ValueError(f"chapter times {path}: needs measured_utc, machine and pages")
    for page, row in data["pages"].items():
        if not isinstance(row, dict):
            raise ValueError(f"chapter times {path}: page {page!r} is not a mapping")
        for key in ("smoke_seconds", "book_seconds"):
            if row.get(key) is not None:
                _seconds(row[key], f"chapter times {path}, page {page!r}, {key}")
    return data


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "an unmeasured time"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def rerun_glue(page: str, path: str | os.PathLike = TIMES_PATH) -> dict[str, str]:
    """``{"<NN>_rerun": sentence}`` for a page's "In this chapter" box (``NN`` the
    chapter's two-digit number as ``chNN``, or the stem of an appendix): its measured times
    at SMOKE size and at the book's parameters, with the machine and date of the
    measurement, or a sentence saying that none is recorded yet."""
    if not isinstance(page, str) or _stem_of(page + ".ipynb") != page:
        raise ValueError(f"page must be a page stem such as '02_diagnosing_miscalibration', "
                         f"got {page!r}")
    data = load_times(path)
    row = data.get("pages", {}).get(page)
    key = f"ch{page[:2]}_rerun" if page[:2].isdigit() else f"{page}_rerun"
    if not row:
        return {key: "Its rerun times are recorded each time the book is built and tested "
                     "(make times); none is recorded for it yet."}
    machine = data["machine"]
    where = (f"{machine.get('cores', '?')} cores of {machine.get('cpu_model') or 'a CPU'}, "
             f"{data['measured_utc'][:10]}")
    return {key: f"Rerunning it took {_duration(row.get('smoke_seconds'))} at SMOKE size and "
                 f"{_duration(row.get('book_seconds'))} at the book's parameters, reading "
                 f"the stored runs (measured when the book was last built and tested, on "
                 f"{where})."}
