"""No measured figure in a code comment or docstring of ``flows/`` or ``bench/*.py``.

Figures go in bench/RESULTS.md with the command that reproduces them; the code says why a
choice matters and points there. A figure is a number followed by a time or size unit
(``us``, ``µs``, ``ms``, ``KB``, ``MB``, ``GB``, ``KiB``, ``MiB``, ``B an``, ``bytes an``);
an approximate size, time or ratio (``~430 bytes``, ``~0.1 s``, ``~50 times``); a
percentage; an instruction count; or "measured" introducing a result ("measured:",
"Measured (...)", "measured by callgrind ... 9,370"). ``.py`` files are read with
``tokenize`` (comments, and strings standing alone as statements: docstrings); ``.pyx``
and ``.pxd`` files by a line scan of ``#`` comments and triple-quoted blocks.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

NUMBER = r"(?<![\w.,])\d[\d,.]*"
FIGURE = re.compile(
    rf"{NUMBER}\s*(?:us|µs|μs|ms|KB|MB|GB|KiB|MiB|GiB)\b"
    rf"|{NUMBER}\s*(?:B|bytes) an\b"
    rf"|~\s*{NUMBER}\s*(?:B|bytes|s|x|×|times)(?![\w^])"
    rf"|{NUMBER}\s*%"
    rf"|{NUMBER}k?\s+(?:machine\s+)?instructions\b"
    r"|\bmeasured\s*[:,(]"
    r"|\bmeasured\s+(?:by|in|at|with|on)\b[^.;]*\d",
    re.IGNORECASE,
)

#: Design constants and behaviour of other software that read like figures, each allowed
#: only in its file: (path, the exact phrase). Nothing here is a measurement.
ALLOWED = {
    # Bytewax 0.21.1 polls an empty source partition again after 1 ms
    ("flows/service/connectors/kafka_partition.py", "1 ms after"),
    ("bench/flow_helpers.py", "1 ms later"),
    ("bench/flow_references.py", "1 ms later"),
    # the passthrough reference's own wait (its code), and the open loop's lateness bound
    ("bench/flow_references.py", "waits 1 ms"),
    ("bench/open_loop.py", "1 ms late"),
    # the wake-up source's period (``WakeUps``' ``period`` as the service builds it)
    ("flows/service/shards/deadlines.py", "10 ms"),
    # the test broker's fetch.wait.max.ms setting, against librdkafka's default
    ("flows/testing/kafka_broker.py", "10 ms, not 500"),
    # the bench's definition of a slow second, and the engine bench's clock step
    ("bench/flow_report.py", "over 100 ms"),
    ("bench/bench_engine.py", "50 ms a batch"),
    # the producer's message size bound (a setting's limit)
    ("flows/service/runtime/settings.py", "64 KiB at most"),
    # where the demo's traffic moves its best arm
    ("flows/tools/traffic.py", "60% of the way"),
}


def _py_texts(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring-like string of Python ``source``."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    texts, previous = [], None
    skipped = {tokenize.NL, tokenize.COMMENT}
    starts = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
    for i, token in enumerate(tokens):
        if token.type == tokenize.COMMENT:
            texts.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and (previous is None or previous.type in starts):
            after = next((t for t in tokens[i + 1 :] if t.type not in skipped), None)
            if after is None or after.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                lines = token.string.splitlines()
                texts += [(token.start[0] + k, line) for k, line in enumerate(lines)]
        if token.type not in skipped:
            previous = token
    return texts


def _pyx_texts(source: str) -> list[tuple[int, str]]:
    """(line, text) of every ``#`` comment and triple-quoted block of Cython ``source``."""
    texts, quote = [], None
    for number, line in enumerate(source.splitlines(), 1):
        if quote is not None:
            texts.append((number, line))
            quote = None if quote in line else quote
            continue
        opened = re.search(r"\"\"\"|'''", line)
        hash_at = line.find("#")
        if opened and (hash_at < 0 or opened.start() < hash_at):
            texts.append((number, line))
            quote = opened.group() if opened.group() not in line[opened.end() :] else None
        elif hash_at >= 0:
            texts.append((number, line[hash_at:]))
    return texts


def figures_in(path: Path) -> list[str]:
    """``path:line: text`` of each comment or docstring line of ``path`` holding a figure."""
    source = path.read_text(encoding="utf-8")
    texts = _pyx_texts(source) if path.suffix in (".pyx", ".pxd") else _py_texts(source)
    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    allowed = [phrase for where, phrase in ALLOWED if where == name]
    found = []
    for number, text in texts:
        for phrase in allowed:
            text = text.replace(phrase, "")
        if FIGURE.search(text):
            found.append(f"{name}:{number}: {text.strip()}")
    return found


def code_files() -> list[Path]:
    """The files the rule covers: flows/ (Python and Cython) and bench/*.py."""
    flows = [p for p in (ROOT / "flows").rglob("*") if p.suffix in (".py", ".pyx", ".pxd")]
    return sorted(flows + list((ROOT / "bench").glob("*.py")))


def test_no_measured_figure_in_code_comments() -> None:
    found = [line for path in code_files() for line in figures_in(path)]
    assert not found, "measured figures belong in bench/RESULTS.md:\n" + "\n".join(found)


def test_every_allowed_phrase_is_still_there() -> None:
    stale = [
        (where, phrase)
        for where, phrase in ALLOWED
        if phrase not in (ROOT / where).read_text(encoding="utf-8")
    ]
    assert not stale, f"allowed phrases no longer in their files (remove them): {stale}"


@pytest.mark.parametrize(
    ("suffix", "source"),
    [
        (".py", "x = 1  # a call costs 1.7 us\n"),
        (".py", 'def f():\n    """Fast.\n\n    Measured: 4.2 against 0.7."""\n'),
        (".py", '"""Module: 75 B an instance."""\n'),
        (".pyx", '# cython: x\n"""Docs.\n\n~8% of the lane\'s instructions.\n"""\n'),
        (".pyx", "cdef int x = 1  # 9,370 instructions an event\n"),
    ],
)
def test_a_figure_is_found(tmp_path: Path, suffix: str, source: str) -> None:
    path = tmp_path / f"module{suffix}"
    path.write_text(source, encoding="utf-8")
    assert figures_in(path)


@pytest.mark.parametrize(
    ("suffix", "source"),
    [
        (".py", 'SHARDS = 32  # per flow\nx = "10 ms"  # a string in code, not a docstring\n'),
        (".py", '"""Rests after REST_AFTER, 1 s; a record of 80 bytes."""\n'),
        (".pyx", "cdef double t = 0.001  # seconds\n"),
    ],
)
def test_design_constants_and_code_pass(tmp_path: Path, suffix: str, source: str) -> None:
    path = tmp_path / f"module{suffix}"
    path.write_text(source, encoding="utf-8")
    assert figures_in(path) == []
