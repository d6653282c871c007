"""No merge-conflict markers in what the repository ships: a merge once left them in docs/install.md,
and nothing that renders or runs docs noticed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Git's own markers: seven characters at the start of a line (a Markdown rule `=======` under text is a
# heading underline, so that one counts only between an opening and a closing marker).
OPENING = re.compile(r"^<{7}( |$)", re.MULTILINE)
CLOSING = re.compile(r"^>{7}( |$)", re.MULTILINE)


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    return [
        ROOT / n
        for n in names
        if n and n.endswith((".md", ".py", ".yaml", ".yml", ".txt", ".tpl", ".sh", ".toml", ".json"))
    ]


def test_no_file_holds_merge_conflict_markers() -> None:
    marked = []
    for path in tracked_text_files():
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if OPENING.search(text) or CLOSING.search(text):
            marked.append(str(path.relative_to(ROOT)))
    assert marked == []
