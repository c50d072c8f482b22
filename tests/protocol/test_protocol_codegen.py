"""The generator, the committed spec copy, the error types, and the package's sans-IO promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from roarmq.protocol import codegen, errors
from roarmq.protocol.errors import (
    AMQPSyntaxError,
    CommandInvalid,
    FrameError,
    HardError,
    ProtocolError,
    ProtocolHeaderMismatch,
    SoftError,
    UnexpectedFrame,
)

REPO = Path(__file__).resolve().parents[2]
SHARED_SPEC = REPO.parent / "shared" / "spec" / codegen.SPEC_NAME


def test_regenerating_spec_py_gives_the_committed_file() -> None:
    assert codegen.generate() == (REPO / "protocol" / "spec.py").read_text()


def test_codegen_check_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "roarmq.protocol.codegen", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_codegen_check_detects_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "spec.py"
    stale.write_text("# stale\n")
    assert codegen.main(["--check", "--output", str(stale)]) == 1
    assert codegen.main(["--output", str(stale)]) == 0
    assert codegen.main(["--check", "--output", str(stale)]) == 0


def test_generator_reads_the_repository_copy_first() -> None:
    assert codegen.find_spec() == REPO / "protocol" / "xml" / codegen.SPEC_NAME
    assert codegen.SPEC_CANDIDATES[1] == SHARED_SPEC


@pytest.mark.skipif(
    not SHARED_SPEC.exists(), reason="no ../shared/spec beside this checkout to compare with"
)
def test_repository_copy_matches_the_shared_spec() -> None:
    assert (REPO / "protocol" / "xml" / codegen.SPEC_NAME).read_bytes() == SHARED_SPEC.read_bytes()


def test_reply_code_constants_match_the_spec() -> None:
    spec = codegen.load_spec(codegen.find_spec())
    for name, value, kind in spec.constants:
        if kind:  # a reply code
            constant = name.upper().replace("-", "_")
            assert getattr(errors, constant) == value
            assert errors.REPLY_TEXT[value] == constant
    assert errors.NO_ROUTE == 312 and errors.REPLY_TEXT[312] == "NO_ROUTE"  # RabbitMQ's addition


@pytest.mark.parametrize(
    "cls, code",
    [
        (FrameError, 501),
        (AMQPSyntaxError, 502),
        (CommandInvalid, 503),
        (UnexpectedFrame, 505),
        (ProtocolHeaderMismatch, 501),
    ],
)
def test_fixed_code_errors(cls: type[HardError], code: int) -> None:
    err = cls("what went wrong", class_id=60, method_id=40)
    assert isinstance(err, HardError) and isinstance(err, ProtocolError)
    assert (err.reply_code, err.text, err.class_id, err.method_id) == (
        code,
        "what went wrong",
        60,
        40,
    )
    assert err.events == []
    assert str(err) == f"{code} {errors.REPLY_TEXT[code]}: what went wrong"


def test_soft_error_carries_its_channel() -> None:
    err = SoftError(
        errors.NOT_FOUND, "no queue 'q' in vhost '/'", channel=3, class_id=50, method_id=10
    )
    assert not isinstance(err, HardError)
    assert (err.reply_code, err.channel) == (404, 3)
    assert err.close_text == "NOT_FOUND - no queue 'q' in vhost '/'"
    assert "channel=3" in repr(err)
    assert len(SoftError(406, "é" * 300).close_text.encode()) <= 255


def test_protocol_never_imports_asyncio() -> None:
    code = (
        "import sys, protocol, protocol.codegen, protocol.frames, protocol.spec\n"
        "assert 'asyncio' not in sys.modules, 'protocol imported asyncio'"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
    for path in (REPO / "protocol").glob("*.py"):
        assert "asyncio" not in path.read_text(), path
