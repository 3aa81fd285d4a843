"""calnotes.book.timings: pages' execution times read from a JUnit report and Jupyter
Book's execution cache, stored and glued into the "In this chapter" boxes."""

from __future__ import annotations

import json
import sqlite3

import pytest

from calnotes.book import timings

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="_build.smoke.02_diagnosing_miscalibration.ipynb" name="Cell 0" time="4.5"/>
<testcase classname="_build.smoke.02_diagnosing_miscalibration.ipynb" name="Cell 1" time="0.25"/>
<testcase classname="_build.smoke.appendix_bin_edges.ipynb" name="Cell 0" time="2"/>
<testcase classname="tests.test_metrics" name="test_ece" time="9"/>
</testsuite></testsuites>"""


def _cache(tmp_path, rows):
    tmp_path.mkdir(exist_ok=True)
    con = sqlite3.connect(tmp_path / "global.db")
    con.execute("CREATE TABLE nbcache (pk INTEGER PRIMARY KEY, uri TEXT, data JSON, "
                "created DATETIME)")
    con.executemany("INSERT INTO nbcache (uri, data, created) VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()
    return tmp_path


def test_smoke_times_sum_the_cells_of_each_notebook(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text(JUNIT)
    times = timings.smoke_times_from_junit(path)
    assert times == pytest.approx({"02_diagnosing_miscalibration": 4.75,
                                   "appendix_bin_edges": 2.0})


def test_smoke_times_refuse_a_report_without_notebooks(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text('<testsuites><testcase classname="tests.x" name="t" time="1"/>'
                    "</testsuites>")
    with pytest.raises(ValueError, match="no notebook cell"):
        timings.smoke_times_from_junit(path)
    path.write_text("<testsuites")
    with pytest.raises(ValueError, match=r"j\.xml: not XML"):
        timings.smoke_times_from_junit(path)
    with pytest.raises(ValueError, match="no such file"):
        timings.smoke_times_from_junit(tmp_path / "absent.xml")


def test_book_times_take_each_pages_latest_record(tmp_path):
    cache = _cache(tmp_path / "c", [
        ("/x/book/04_logitnorm.md", json.dumps({"execution_seconds": 100.0}), "2026-01-01"),
        ("/x/book/04_logitnorm.md", json.dumps({"execution_seconds": 80.5}), "2026-01-02"),
        ("/x/book/index.md", json.dumps({}), "2026-01-02"),
    ])
    assert timings.book_times_from_cache(cache) == {"04_logitnorm": 80.5}


def test_book_times_refuse_a_bad_cache(tmp_path):
    with pytest.raises(ValueError, match="build the book first"):
        timings.book_times_from_cache(tmp_path)
    cache = _cache(tmp_path / "c", [("/x/book/04_logitnorm.md",
                                     json.dumps({"execution_seconds": -1}), "2026-01-01")])
    with pytest.raises(ValueError, match="finite and >= 0"):
        timings.book_times_from_cache(cache)


def test_written_times_read_back_and_glue(tmp_path):
    path = timings.write_times({"02_diagnosing_miscalibration": 42.0},
                               {"02_diagnosing_miscalibration": 600.0, "appendix_x": 30.0},
                               {"cpu_model": "Some CPU", "cores": 2}, tmp_path / "t.json")
    data = timings.load_times(path)
    assert data["pages"]["appendix_x"] == {"smoke_seconds": None, "book_seconds": 30.0}
    glue = timings.rerun_glue("02_diagnosing_miscalibration", path)
    assert glue == {"ch02_rerun": "Rerunning it took 42 s at SMOKE size and 10 min at the "
                                  "book's parameters, reading the stored runs (measured when "
                                  "the book was last built and tested, on 2 cores of Some "
                                  f"CPU, {data['measured_utc'][:10]})."}
    assert "an unmeasured time at SMOKE size and 30 s at" in \
        timings.rerun_glue("appendix_x", path)["appendix_x_rerun"]


def test_glue_without_a_measurement_says_so(tmp_path):
    glue = timings.rerun_glue("05_meta_regularization", tmp_path / "absent.json")
    assert list(glue) == ["ch05_rerun"] and "none is recorded" in glue["ch05_rerun"]
    with pytest.raises(ValueError, match="page must be a page stem"):
        timings.rerun_glue("05 meta", tmp_path / "absent.json")


def test_a_malformed_times_file_is_named(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"measured_utc": "2026", "machine": {},
                                "pages": {"p": {"book_seconds": "long"}}}))
    with pytest.raises(ValueError, match=r"t\.json, page 'p', book_seconds"):
        timings.load_times(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        timings.load_times(path)
