"""Every kind of log record has one byte of its own, defined in one module, and every
module that writes a kind takes it from there."""

from __future__ import annotations

import re
from pathlib import Path

from roarmq.broker.store import record_tags

BROKER = Path(record_tags.__file__).resolve().parents[1]


def test_no_two_kinds_share_a_byte():
    tags = record_tags.TAGS
    assert len(tags) >= 11, tags
    assert all(len(tag) == 1 for tag in tags.values()), tags
    assert len(set(tags.values())) == len(tags), tags


def test_no_module_spells_a_kind_of_its_own():
    """A record kind spelt as a one-byte literal next to a record layout (`.pack(b"X"`,
    `== b"X"` against a tag, or `NAME_TAG = b"X"`) anywhere but record_tags.py."""
    spelt = re.compile(r"""(\.pack\(b"[^"]"|tag == b"[^"]"|kind == b"[^"]"|_TAG = b")""")
    found = [
        f"{path.relative_to(BROKER)}:{n}: {line.strip()}"
        for path in BROKER.rglob("*.py")
        if path.name != "record_tags.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelt.search(line)
    ]
    assert not found, found
