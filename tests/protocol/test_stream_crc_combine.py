"""A chunk of stored batches gets its CRC-32 from theirs: the same as over the joined
bytes, with libz's crc32_combine and without it (a CPython with zlib linked in)."""

from __future__ import annotations

import os
import zlib

import pytest

from roarmq.protocol.stream import codec


@pytest.mark.parametrize("combine", ["libz", "none"])
def test_the_crc_of_parts_is_the_crc_of_them_joined(monkeypatch, combine):
    if combine == "none":
        monkeypatch.setattr(codec, "_COMBINE", None)
    else:
        assert codec._COMBINE is not None  # Debian's CPython loads libz.so.1
    parts = [os.urandom(n) for n in (1, 11_000, 0, 4096, 70_001)]
    crcs = [zlib.crc32(p) for p in parts]
    assert codec.crc32_of_parts(parts, crcs) == zlib.crc32(b"".join(parts))
    assert codec.crc32_of_parts(parts[:1], crcs[:1]) == crcs[0]
