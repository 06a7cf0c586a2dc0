"""dlio_ckpt-analyze on foreign Darshan logs: what PyDarshan's `darshan summary` shows, console
streams kept out of the checkpoint figures, the bandwidth headline explained, and the HTML page.

Expected figures are computed here from PyDarshan's raw records (`report.records[...]`, not the
analysis' frames), so each test checks the analysis against Darshan's own counters. The single
DLIO log used for speed is the main process of the DLIO job: it wrote the checkpoint and 13,185
bytes of <STDERR>.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

darshan = pytest.importorskip("darshan")
pytest.importorskip("matplotlib")
pytest.importorskip("pandas")

from dlio_ckpt.analysis.cli import main  # noqa: E402
from dlio_ckpt.analysis.report import key_figures  # noqa: E402

DLIO_LOGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "darshan" / "dlio_logs"  # ../shared beside the repo
MAIN_LOG = DLIO_LOGS / "snyder_python3_id3116902-2110365_12-19-66957-188958432683465822_1.darshan"
CONSOLE = ("<STDIN>", "<STDOUT>", "<STDERR>")
MIB = float(1 << 20)

needs_dlio_logs = pytest.mark.skipif(not DLIO_LOGS.is_dir(), reason="shared DLIO Darshan logs not present")


def run_json(capsys, argv: list[str]) -> dict:
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def posix_records(path: Path) -> list[tuple[str, dict, dict, float]]:
    """(file name, counters, fcounters, log start) per POSIX record, from PyDarshan's raw records."""
    report = darshan.DarshanReport(str(path), read_all=True)
    job = report.metadata["job"]
    start = job["start_time_sec"] + job["start_time_nsec"] * 1e-9
    frames = report.records["POSIX"].to_df()
    c, f = frames["counters"], frames["fcounters"]
    return [(report.name_records[int(c["id"][i])], c.iloc[i].to_dict(), f.iloc[i].to_dict(), start) for i in range(len(c))]


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Wall-clock seconds covered by the intervals, merged one by one (an independent reference)."""
    total, current = 0.0, None
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if current is None or start > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return total + (current[1] - current[0] if current else 0.0)


@needs_dlio_logs
def test_stderr_writes_are_console_not_checkpoint(capsys):
    """The log's <STDERR> record wrote 13,185 bytes; they were counted as checkpoint writes."""
    records = posix_records(MAIN_LOG)
    files = [(c, f) for name, c, f, _ in records if name not in CONSOLE]
    console = [(c, f) for name, c, f, _ in records if name in CONSOLE]
    doc = run_json(capsys, [str(MAIN_LOG)])
    written_to_files = sum(int(c["POSIX_BYTES_WRITTEN"]) for c, _ in files)
    console_written = sum(int(c["POSIX_BYTES_WRITTEN"]) for c, _ in console)
    assert console_written == 13185
    assert doc["bytes_written"] == written_to_files + console_written  # totals stay PyDarshan's sums
    assert doc["per_phase"]["write"]["bytes_written"] == written_to_files
    assert doc["per_phase"]["console"]["bytes_written"] == console_written
    assert doc["console"]["bytes_written"] == console_written
    assert doc["io_time_share"]["checkpoint_s"] == pytest.approx(sum(f["POSIX_F_WRITE_TIME"] for _, f in files))
    assert sum(doc["histogram"]["write"]) == sum(int(c["POSIX_WRITES"]) for c, _ in files)
    cards = {label: note for label, _, note in key_figures(_analysis(MAIN_LOG))}
    assert "13,185 B console" in cards["bytes written"]  # the tile says which part was the console


def _analysis(*paths: Path, timeline: bool = False):
    from dlio_ckpt.analysis.darshan_logs import analyse_logs

    (job,) = analyse_logs(list(paths), timeline=timeline)
    return job


@needs_dlio_logs
def test_wall_clock_rate_explains_the_headline_bandwidth():
    """The 24 DLIO logs: 121 GiB / the slowest worker's 5.75 s in read calls is 21,546 MiB/s, while
    the bandwidth plot peaks near 4,800 MiB/s; the workers of successive epochs did not read at the
    same time, and the wall-clock rate says what the job got."""
    logs = sorted(DLIO_LOGS.glob("*.darshan"))
    job = _analysis(*logs, timeline=True)
    t0 = min(start for log in logs for *_, start in posix_records(log)[:1])
    nbytes, intervals, per_process = 0, [], []
    for log in logs:
        read_s = 0.0
        for name, c, f, start in posix_records(log):
            read_s += f["POSIX_F_READ_TIME"]
            if name in CONSOLE or not c["POSIX_BYTES_READ"]:
                continue
            nbytes += int(c["POSIX_BYTES_READ"])
            intervals.append((start - t0 + f["POSIX_F_READ_START_TIMESTAMP"], start - t0 + f["POSIX_F_READ_END_TIMESTAMP"]))
        per_process.append(read_s)
    read = job.per_phase["read"]
    estimate = nbytes / max(per_process) / MIB
    active = union_seconds(intervals)
    assert read["read_mib_per_s"] == pytest.approx(estimate) and round(estimate) == 21546
    assert read["active_s"] == pytest.approx(active)
    assert read["wall_mib_per_s"] == pytest.approx(nbytes / active / MIB)
    assert read["overlap"] == pytest.approx(sum(per_process) / active)
    timeline = job.timeline
    peak = timeline.read.sum(axis=0).max() / timeline.bin_width_s / MIB  # the plot's highest point
    assert read["wall_mib_per_s"] <= peak < estimate / 4
    warning = next(w for w in job.warnings if w.startswith("read bandwidth"))
    assert f"{estimate:,.0f} MiB/s" in warning and f"{nbytes / active / MIB:,.0f} MiB/s" in warning
    assert not any(w.startswith("write bandwidth") for w in job.warnings)  # one process wrote: nothing to explain


def test_active_seconds_counts_overlap_once():
    from dlio_ckpt.analysis.darshan_summary import active_seconds

    starts, ends = np.array([0.0, 1.0, 5.0, 5.5, 9.0]), np.array([2.0, 1.5, 6.0, 7.0, 9.0])
    assert active_seconds(starts, ends) == pytest.approx(2.0 + 2.0)  # [0,2] and [5,7]; [9,9] moves nothing
    assert union_seconds(list(zip(starts, ends))) == pytest.approx(4.0)


@needs_dlio_logs
def test_common_access_sizes_seeks_and_lustre_match_the_records(capsys):
    records = [(name, c) for name, c, _, _ in posix_records(MAIN_LOG) if name not in CONSOLE]
    counts: dict[int, int] = {}
    for _, c in records:
        for i in range(1, 5):
            if c[f"POSIX_ACCESS{i}_COUNT"] > 0:
                size = int(c[f"POSIX_ACCESS{i}_ACCESS"])
                counts[size] = counts.get(size, 0) + int(c[f"POSIX_ACCESS{i}_COUNT"])
    doc = run_json(capsys, [str(MAIN_LOG)])
    got = {a["size"]: a["count"] for a in doc["common_access_sizes"]}
    assert len(got) == min(4, len(counts)) and all(counts[size] == n for size, n in got.items())
    assert min(got.values()) >= max((n for s, n in counts.items() if s not in got), default=0)  # the most common
    assert doc["operations"]["seek"] == sum(int(c["POSIX_SEEKS"]) for _, c in records) > 0
    assert doc["operations"]["read"] == sum(int(c["POSIX_READS"]) for _, c in records)
    # Lustre: stripe size and count of every file, from the raw records (counters[0], [1] of the first component)
    report = darshan.DarshanReport(str(MAIN_LOG), read_all=True)
    layouts: dict[tuple[int, int], int] = {}
    for record in report.records["LUSTRE"]:
        first = record["components"][0]["counters"]
        layouts[(int(first[0]), int(first[1]))] = layouts.get((int(first[0]), int(first[1])), 0) + 1
    lustre = doc["lustre"]
    assert lustre["files"] == len(report.records["LUSTRE"]) == 24
    assert {(x["stripe_size"], x["stripe_count"]): x["files"] for x in lustre["layouts"]} == layouts


def test_log_without_lustre_has_no_lustre_section(capsys):
    log = Path(darshan.__file__).parent / "examples" / "example_logs" / "dxt.darshan"
    doc = run_json(capsys, [str(log)])
    assert doc["lustre"] is None and doc["partial_modules"] == []
    assert not any("partial" in w for w in doc["warnings"])


@needs_dlio_logs
def test_partial_module_data_is_warned(tmp_path, capsys):
    """Bit 1 of the header's partial flag marks the POSIX module incomplete, as darshan-runtime sets
    it when it runs out of record memory."""
    log = tmp_path / "partial.darshan"
    data = bytearray(MAIN_LOG.read_bytes())
    data[24] |= 1 << 1  # partial_flag (uint64 at byte 24), bit = POSIX module index
    log.write_bytes(bytes(data))
    assert darshan.DarshanReport(str(log), read_all=True).modules["POSIX"]["partial_flag"]
    doc = run_json(capsys, [str(log)])
    assert doc["partial_modules"] == ["POSIX in partial.darshan"]
    assert any(w.startswith("partial log:") and "POSIX in partial.darshan" in w for w in doc["warnings"])
    assert main([str(log), "--no-plots", "--out-dir", str(tmp_path / "out")]) == 0
    assert "partial log" in capsys.readouterr().out
    assert "> **Warning:** partial log:" in (tmp_path / "out" / "report.md").read_text()


@needs_dlio_logs
def test_html_report_has_captioned_figures(tmp_path):
    import base64
    import re

    from dlio_ckpt.analysis.report import FIGURE_CAPTIONS

    assert main([str(MAIN_LOG), "--output", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    figures = re.findall(r"<figure[^>]*><h4>([^<]+)</h4><img src='data:image/png;base64,([^']+)'[^>]*>"
                         r"<figcaption>([^<]+)</figcaption>", page)
    titles = [title for title, _, _ in figures]
    assert titles == ["Bandwidth over time", "I/O cost per phase", "I/O time per rank", "Access sizes",
                      "Operation counts", "Heat map"]
    for _, png, caption in figures:
        assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n" and len(caption) > 40
    assert FIGURE_CAPTIONS["io_cost"][1] in page
    assert page.count("class='card'") >= 5 and "<details>" in page
    markdown = main([str(MAIN_LOG), "--output", str(tmp_path / "md" / "report.md")])
    text = (tmp_path / "md" / "report.md").read_text()
    assert markdown == 0 and "**I/O cost per phase**" in text and f"*{FIGURE_CAPTIONS['ranks'][1]}*" in text


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@needs_dlio_logs
@pytest.mark.skipif(_chromium() is None, reason="headless Chromium not installed (Debian: apt-get install chromium)")
def test_html_report_screenshot_in_headless_chromium(tmp_path):
    """The page as a browser draws it: the header band, key-figure tiles and the embedded figures
    (their bars in the report's read blue) must all be on the screenshot."""
    from PIL import Image

    report = tmp_path / "report.html"
    assert main([str(MAIN_LOG), "--output", str(report)]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2400",
                    f"--screenshot={shot}", report.as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.is_file(), "chromium wrote no screenshot"
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape[:2] == (2400, 1280)
    header = pixels[5:60, 5:300].reshape(-1, 3).mean(axis=0)
    assert header[2] > header[0] + 20 and header.max() < 120  # the dark blue header band
    read_blue = np.all(pixels == (31, 119, 180), axis=-1).sum()  # matplotlib C0: read bars and lines
    write_red = np.all(pixels == (214, 39, 40), axis=-1).sum()
    assert read_blue > 2000 and write_red > 2000, (read_blue, write_red)
