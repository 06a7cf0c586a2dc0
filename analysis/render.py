"""The report's blocks (report.py) rendered as Markdown or as one self-contained HTML page.

Apart from building the blocks so that the two renderers read one block list and can never
disagree on which figures they show.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from dlio_ckpt.analysis.report import Block


def to_markdown(blocks: list[Block]) -> str:
    def text(value: Any) -> str:
        """`<STDERR>` would be taken for an HTML tag and vanish: escaped, it renders as written."""
        return str(value).replace("<", "\\<")

    def cell(value: Any) -> str:
        return text(value).replace("|", "\\|").replace("\n", " ")

    def table(headers, rows) -> list[str]:
        return (["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
                + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows] + [""])

    lines: list[str] = []
    for block in blocks:
        kind = block[0]
        if kind == "h":
            lines += ["#" * block[1] + " " + block[2], ""]
        elif kind == "p":
            if block[1]:
                lines += [text(block[1]), ""]
        elif kind == "ul":
            lines += [f"- {text(item)}" for item in block[1]] + [""]
        elif kind == "warn":
            lines += [f"> **Warning:** {text(item)}" for item in block[1]] + [""]
        elif kind == "cards":
            lines += table(["figure", "value", "what it counts"], block[1])
        elif kind == "table":
            lines += table(block[1], block[2])
        elif kind == "img":
            lines += [f"![{block[2]}]({block[1]})", ""]
        elif kind == "figure":
            lines += [f"**{block[4]}**", "", f"![{block[2]}]({block[1]})", "", f"*{text(block[5])}*", ""]
    return "\n".join(lines)


# The page's look: a header band, key figures as tiles, warnings in an amber box, figures as
# captioned cards two to a row, long tables folded. System fonts only: the file must render the
# same offline and on a cluster login node's browser.
_CSS = """
:root{--ink:#1f2933;--muted:#616e7c;--line:#e4e7eb;--bg:#f5f7fa;--accent:#1f77b4;--warn:#f0b429}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.5 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",
 "DejaVu Sans",Arial,sans-serif}
header{background:linear-gradient(90deg,#102a43,#1f4e79);color:#fff;padding:22px 40px}
header h1{margin:0;font-size:22px;font-weight:600}
header p{margin:4px 0 0;color:#bcccdc}
main{max-width:1240px;margin:0 auto;padding:12px 40px 40px}
section.job{background:#fff;border:1px solid var(--line);border-radius:10px;padding:6px 24px 18px;margin:18px 0;
 box-shadow:0 1px 3px rgba(16,42,67,.06)}
h2{font-size:19px;margin:16px 0 4px;font-weight:600}
h3{font-size:15px;margin:22px 0 6px;padding-bottom:4px;border-bottom:2px solid var(--line);font-weight:600;color:#243b53}
p{margin:6px 0;color:var(--ink)}
.warn{background:#fffbea;border-left:4px solid var(--warn);border-radius:6px;padding:8px 14px;margin:10px 0}
.warn li{margin:3px 0}.warn ul{margin:0;padding-left:18px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:10px;margin:12px 0}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 14px;background:#fbfcfd}
.card .label{font-size:11px;text-transform:uppercase;letter-spacing:.06em;color:var(--muted)}
.card .value{font-size:21px;font-weight:600;color:#102a43;margin:2px 0}
.card .note{font-size:11.5px;color:var(--muted);line-height:1.35}
.figs{display:grid;grid-template-columns:1fr 1fr;gap:14px;margin:10px 0}
figure{margin:0;border:1px solid var(--line);border-radius:8px;padding:10px;background:#fff}
figure.wide{grid-column:1/-1}
figure h4{margin:0 0 6px;font-size:13.5px;font-weight:600}
figure img{width:100%;height:auto;display:block}
figcaption{font-size:12px;color:var(--muted);margin-top:6px;line-height:1.4}
table{border-collapse:collapse;margin:6px 0 10px;font-size:12.5px;font-variant-numeric:tabular-nums}
th{background:#f0f4f8;color:#334e68;font-weight:600;text-align:right;padding:5px 9px;border-bottom:2px solid #d9e2ec}
td{padding:4px 9px;border-bottom:1px solid var(--line);text-align:right}
tr:nth-child(even) td{background:#fafbfc}
td:first-child,th:first-child{text-align:left}
table.kv td,table.kv th{text-align:left}table.kv td:last-child{max-width:900px;overflow-wrap:anywhere}
details{margin:6px 0}summary{cursor:pointer;color:var(--accent);font-size:12.5px}
.scroll{overflow-x:auto}
"""


def to_html(blocks: list[Block]) -> str:
    e = html.escape

    def table(block: Block) -> str:
        head = "".join(f"<th>{e(str(h))}</th>" for h in block[1])
        body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in block[2])
        kv = " class='kv'" if len(block[1]) == 2 and block[1][1] == "value" else ""  # label: value lists read left to right
        text = f"<div class='scroll'><table{kv}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        return f"<details><summary>{e(block[3])}</summary>{text}</details>" if len(block) > 3 and block[3] else text

    title = next((b[2] for b in blocks if b[0] == "h" and b[1] == 1), "dlio_ckpt I/O analysis")
    parts = ["<!DOCTYPE html>", f"<html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>",
             f"<meta name='viewport' content='width=device-width,initial-scale=1'><style>{_CSS}</style>",
             "</head><body>"]
    figures: list[str] = []
    in_job = False

    def flush() -> None:
        if figures:
            parts.append("<div class='figs'>" + "".join(figures) + "</div>")
            figures.clear()

    for index, block in enumerate(blocks):
        kind = block[0]
        if kind != "figure":
            flush()
        if kind == "h" and block[1] == 1:
            subtitle = blocks[index + 1][1] if index + 1 < len(blocks) and blocks[index + 1][0] == "p" else ""
            parts.append(f"<header><h1>{e(block[2])}</h1><p>{e(subtitle)}</p></header><main>")
        elif kind == "h" and block[1] == 2:
            if in_job:
                parts.append("</section>")
            parts.append(f"<section class='job'><h2>{e(block[2])}</h2>")
            in_job = True
        elif kind == "h":
            parts.append(f"<h{block[1] + 1}>{e(block[2])}</h{block[1] + 1}>")
        elif kind == "p":
            if block[1] and not (index > 0 and blocks[index - 1][0] == "h" and blocks[index - 1][1] == 1):
                parts.append(f"<p>{e(block[1])}</p>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{e(str(i))}</li>" for i in block[1]) + "</ul>")
        elif kind == "warn":
            parts.append("<div class='warn'><ul>" + "".join(f"<li>{e(str(i))}</li>" for i in block[1]) + "</ul></div>")
        elif kind == "cards":
            parts.append("<div class='cards'>" + "".join(
                f"<div class='card'><div class='label'>{e(label)}</div><div class='value'>{e(value)}</div>"
                f"<div class='note'>{e(note)}</div></div>" for label, value, note in block[1]) + "</div>")
        elif kind == "table":
            parts.append(table(block))
        elif kind == "img":
            parts.append(f"<p><img src='{_data_uri(block)}' alt='{e(block[2])}' data-file='{e(block[1])}'></p>")
        elif kind == "figure":
            wide = " class='wide'" if block[2].endswith((" bandwidth", " heatmap")) else ""
            figures.append(f"<figure{wide}><h4>{e(block[4])}</h4><img src='{_data_uri(block)}' alt='{e(block[2])}' "
                           f"data-file='{e(block[1])}'><figcaption>{e(block[5])}</figcaption></figure>")
    flush()
    if in_job:
        parts.append("</section>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _data_uri(block: Block) -> str:
    """The figure inside the page (base64 PNG), so the HTML report is one file that can be mailed
    or attached; the relative link when the file is not there to read."""
    source = Path(block[3]) if len(block) > 3 else None
    if source is None or not source.is_file():
        return html.escape(block[1])
    return "data:image/png;base64," + base64.b64encode(source.read_bytes()).decode("ascii")


def render(blocks: list[Block], fmt_name: str) -> str:
    return to_html(blocks) if fmt_name == "html" else to_markdown(blocks)
