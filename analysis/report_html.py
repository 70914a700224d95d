"""report.html: report.md as one self-contained page, its plots embedded, for the MLflow UI.

MLflow 3.17's artifact viewer shows a Markdown image as the text of its link, whatever the
link points at; it shows an HTML artifact as a page. So the parent run carries report.md (to
read and paste) and report.html beside it (to look at in the UI), its PNGs inlined as data:
URLs: the page needs nothing else from the store (docs/monitoring.md).
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

# a Markdown image whose target is a file next to the report: `![name](plots/x.png)`
_IMAGE = re.compile(r"(!\[[^\]]*\]\()([^)\s]+\.png)(\))")
_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;"
    "line-height:1.45;color:#222}table{border-collapse:collapse;margin:0.8em 0;font-size:0.92em}"
    "th,td{border:1px solid #ccc;padding:0.25em 0.55em;text-align:left}th{background:#f4f4f4}"
    "img{max-width:100%;border:1px solid #eee}code{background:#f4f4f4;padding:0 0.2em}"
)


def report_html(markdown: str, report_dir: Path, title: str) -> str:
    """The HTML page of `markdown` (a report written in `report_dir`), each PNG it links
    relative to that folder embedded; a link to a missing file is left as it is."""
    from markdown_it import MarkdownIt

    def embed(m: re.Match[str]) -> str:
        png = report_dir / m[2]
        if not png.is_file():
            return m[0]
        data = base64.b64encode(png.read_bytes()).decode()
        return f"{m[1]}data:image/png;base64,{data}{m[3]}"

    body = (
        MarkdownIt("commonmark", {"html": False})
        .enable("table")
        .render(_IMAGE.sub(embed, markdown))
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )
