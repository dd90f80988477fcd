"""The README's quickstart runs as written: its ```python blocks (those between the "## Quickstart" heading and the
next "## " heading) are run in order, as one script, in a fresh Python process started in an empty folder. On a
machine without a GPU the script takes the CPU path with the Triton kernels in Triton's interpreter, as the rest of
the CPU suite (conftest.py sets TRITON_INTERPRET=1, which the child process inherits)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
HEADING = "## Quickstart"


def quickstart_blocks(text: str) -> list[str]:
    """The bodies of the ```python blocks of the section under ``HEADING``; [] when there is no such section."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == HEADING)
    except StopIteration:
        return []
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = "\n".join(lines[start + 1:end]) + "\n"
    return re.findall(r"^```python\n(.*?)^```\s*$", section, flags=re.S | re.M)


def test_quickstart_blocks_are_found():
    with open(README, encoding="utf-8") as f:
        blocks = quickstart_blocks(f.read())
    assert blocks, f"README.md has no ```python block under {HEADING!r}"
    assert any("import fastnf4" in b for b in blocks)


def test_extractor_reads_only_the_quickstart_section():
    text = ("# x\n## Install\n```python\nnot_this()\n```\n## Quickstart\ntext\n```python\na = 1\n```\n"
            "```bash\nnot_python\n```\n```python\nb = a\n```\n## Next\n```python\nnor_this()\n```\n")
    assert quickstart_blocks(text) == ["a = 1\n", "b = a\n"]
    assert quickstart_blocks("# no quickstart here\n```python\nx = 1\n```\n") == []


def test_quickstart_runs(tmp_path):
    with open(README, encoding="utf-8") as f:
        script = "\n".join(quickstart_blocks(f.read()))
    assert script
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ), capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, f"the README quickstart failed:\n{res.stdout}\n{res.stderr}"
