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


def test_runs_combine_as_their_bytes_do_and_only_with_libz(monkeypatch):
    runs = [os.urandom(n) for n in (70_000, 1, 65_536)]
    crcs = [zlib.crc32(r) for r in runs]
    assert codec.crc32_combinable()
    assert codec.combined_crc32(crcs, [len(r) for r in runs]) == zlib.crc32(b"".join(runs))
    monkeypatch.setattr(codec, "_COMBINE", None)
    assert not codec.crc32_combinable()
    with pytest.raises(RuntimeError):
        codec.combined_crc32(crcs, [len(r) for r in runs])
