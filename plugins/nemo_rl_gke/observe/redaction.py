"""Mask secret values in a stream of log text, however the text splits them.

:class:`StreamRedactor` is built once (per trigger) from the secret values and replaces every occurrence of a secret
with ``***``, also when:

* line breaks, ``\\r`` redraws, terminal colour codes or a Ray actor prefix after a line break (``(Worker pid=7) ``)
  sit between any two of its characters: the breaks and prefixes are kept, only the secret's characters are masked;
* the secret arrives in pieces across :meth:`StreamRedactor.feed` calls (polls): a suffix of the text that could
  still be the start of a secret is held back until more text, or :meth:`StreamRedactor.flush` at the end, decides;
* it is written in a URL or JSON: any character may be percent-encoded (either hex case, ``+`` for a space) or
  JSON-escaped (``\\"``, ``\\\\``, ``\\/``).

Redact *before* splitting text into lines or cutting it for display, so that no later step can cut a secret in two.
Matching runs in linear time in the text (atomic groups and possessive quantifiers: no backtracking between the
characters of a secret). Pure and stdlib-only (the triggerer imports it); the values are never logged, shown by
``repr`` or serialized.

Limits: secrets shorter than :data:`MIN_SECRET_CHARS` are ignored (as Airflow's own masker does). At most
:data:`MAX_HOLD_CHARS` are held back: a start of a secret followed by more line breaks, codes and prefixes than that
(and nothing else) is masked as if it were the secret and passed on, so a rest that arrives later is not recognised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MASK = "***"
# Airflow's [logging] min_length_masked_secret default: shorter values would mask ordinary words.
MIN_SECRET_CHARS = 5
# Secrets longer than this are matched as pieces of this many characters (each masked on its own), which keeps the
# held-back-prefix pattern shallow (it nests one group per character) and masks a long secret's pieces anywhere.
PIECE_CHARS = 64
# At most this much text is held back waiting for the rest of a secret; past it the candidate prefix is masked.
MAX_HOLD_CHARS = 16 * 1024
# feed() works through its input in slices this long: each regex call then holds the GIL only briefly.
SLICE_CHARS = 64 * 1024
# A held-back start of a secret still unfinished when the log ends is masked from this many characters on.
MIN_PARTIAL_AT_END = 6

# What may sit between two characters of a secret: colour codes, line breaks, and after a line break what starts a
# line: Ray's actor prefix (coloured: "\x1b[36m(W pid=2)\x1b[0m ") and indentation. Possessive: consumed whole, never
# given back, so a match attempt cannot backtrack into it (and cheaper in `re` than an atomic group around a repeat).
_CSI = r"\x1b\[[0-?]{0,32}[ -/]{0,8}[@-~]"
_LINE_START = rf"(?:{_CSI}|\([^()\r\n]{{0,200}}\)|[ \t])"
_GAP = rf"(?:{_CSI})*+(?:[\r\n]++{_LINE_START}*+)*+"
_GAP_RUN_RE = re.compile(rf"(?:{_CSI}|[\r\n]++{_LINE_START}*+)++")
# The start of a colour code or actor prefix that the end of the text cut short.
_UNFINISHED_GAP = r"(?:\x1b(?:\[[0-?]{0,32}[ -/]{0,8})?|\([^()\r\n]{0,200})"
_LINE_BREAKS = re.compile(r"[\r\n]")


def _hex_digit(value: int) -> str:
    """A regex for one hex digit in either case."""
    digit = f"{value:X}"
    return digit if digit.isdigit() else f"[{digit}{digit.lower()}]"


def _spellings(char: str) -> list[str]:
    """Regexes for the ways a character of a secret can be written (escaped forms first: they are longer)."""
    encoded = "".join(f"%{_hex_digit(b >> 4)}{_hex_digit(b & 15)}" for b in char.encode("utf-8", "surrogatepass"))
    forms = [encoded]
    if char in '"\\/':
        forms.append(re.escape("\\" + char))
    if char == " ":
        forms.append(r"\+")
    forms.append(re.escape(char))
    return forms


def _partial_spelling(form: str) -> str | None:
    """A regex for a non-empty proper prefix of one spelling, or None for a one-character spelling."""
    atoms = re.findall(r"\[[^\]]*\]|\\.|.", form)
    if len(atoms) < 2:
        return None
    inner = ""
    for atom in reversed(atoms[1:-1]):
        inner = f"(?:{atom}{inner})?"
    return atoms[0] + inner


class _Target:
    """One secret (or piece of a long one) as regexes: the whole, gapped and spelled, and a start cut off at the end."""

    def __init__(self, chars: str, *, literal: bool) -> None:
        # literal: each character only as itself (needed when the secret has '%' or '\\', whose escapes come first).
        units = [[re.escape(c)] if literal else _spellings(c) for c in chars]
        self.size = len(chars)
        self.whole = _GAP.join(f"(?>{'|'.join(forms)})" for forms in units)
        # P(k) = unit k [gap [P(k+1) | unfinished gap]] | a cut-off spelling of unit k; the last unit is never whole
        # (a whole secret is a match, not a start).
        partial = ""
        for k in range(len(units) - 1, -1, -1):
            forms = units[k]
            cut = "|".join(p for p in map(_partial_spelling, forms) if p)
            branches = []
            if k < len(units) - 1:
                branches.append(f"(?>{'|'.join(forms)})(?:{_GAP}(?:{partial}|{_UNFINISHED_GAP})?)?")
            if cut:
                branches.append(cut)
            partial = "|".join(branches) if branches else "(?!)"
            partial = f"(?:{partial})"
        self.partial = partial


class StreamRedactor:
    """Masks secret values in text fed in pieces; built once from the values, reusable for one-shot :meth:`redact`.

    :param secrets: the values to mask (empty and short ones are ignored; line breaks inside a value are dropped).
    :param mask: what replaces each run of a secret's characters.
    """

    def __init__(self, secrets: Iterable[str], *, mask: str = MASK) -> None:
        self._mask = mask
        self._held = ""
        values = sorted({_LINE_BREAKS.sub("", s) for s in secrets if isinstance(s, str)} - {""}, key=len, reverse=True)
        values = [v for v in values if len(v) >= MIN_SECRET_CHARS]
        targets: list[_Target] = []
        for value in values:
            pieces = (
                [value]
                if len(value) <= PIECE_CHARS
                else [value[i : i + PIECE_CHARS] for i in range(0, len(value) - PIECE_CHARS, PIECE_CHARS)]
                + [value[-PIECE_CHARS:]]
            )
            for piece in pieces:
                targets.append(_Target(piece, literal=False))
                if "%" in piece or "\\" in piece:
                    targets.append(_Target(piece, literal=True))
        # Longest first: at one position the alternation takes the first that matches.
        targets.sort(key=lambda t: t.size, reverse=True)
        self._count = len(values)
        self._full: re.Pattern[str] | None = None
        self._start: re.Pattern[str] | None = None
        if targets:
            # A lookahead so that overlapping occurrences (of two secrets, or of a periodic one) are all found.
            self._full = re.compile("(?=(" + "|".join(t.whole for t in targets) + "))")
            self._start = re.compile("(?:" + "|".join(t.partial for t in targets) + r")\Z")

    def __repr__(self) -> str:
        return f"StreamRedactor({self._count} secret(s))"

    def __getstate__(self) -> dict[str, Any]:
        # One without secrets (a trigger's before run() loads them) may be copied like any object; one with is not.
        if self._full is not None:
            raise TypeError("a StreamRedactor holds secret values and is never serialized")
        return dict(self.__dict__)

    @property
    def active(self) -> bool:
        """Whether there is anything to mask."""
        return self._full is not None

    @property
    def holding(self) -> bool:
        """Whether text fed is held back (it could start a secret): the stream is not at a clean point."""
        return bool(self._held)

    # --- streaming ------------------------------------------------------------------------------------------------
    def feed(self, text: str) -> str:
        """The next piece of the stream; returns the text now safe to pass on (possibly less than was fed)."""
        if self._full is None:
            return text
        out = []
        for i in range(0, len(text), SLICE_CHARS):
            released, self._held = self._step(self._held, text[i : i + SLICE_CHARS])
            out.append(released)
        return "".join(out)

    def flush(self) -> str:
        """End of the stream: the held-back text, with a long enough unfinished start of a secret masked."""
        held, self._held = self._held, ""
        return self._final(held) if held else ""

    def reset(self) -> None:
        """Forget the held-back text (the stream was replaced)."""
        self._held = ""

    def redact(self, text: str) -> str:
        """Mask a complete text, apart from the stream: the message of an event, a line of its tail."""
        if self._full is None or not text:
            return text
        out, held = [], ""
        for i in range(0, len(text), SLICE_CHARS):
            released, held = self._step(held, text[i : i + SLICE_CHARS])
            out.append(released)
        out.append(self._final(held))
        return "".join(out)

    def redact_value(self, value: Any) -> Any:
        """Mask every string in a JSON-like value (dict keys included); other values are returned as they are."""
        if self._full is None:
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact_value(k): self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact_value(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.redact_value(v) for v in value)
        return value

    # --- internals ------------------------------------------------------------------------------------------------
    def _step(self, held: str, text: str) -> tuple[str, str]:
        """Mask ``held + text``; return the part safe to release and the part to hold back."""
        buf = held + text
        spans = self._spans(buf)
        cut = self._start_of_unfinished(buf)
        if cut is None:
            return self._masked(buf, spans), ""
        # A masked span that the cut would split is held back whole: it is found again with the text that follows.
        for start, end in reversed(spans):
            if start < cut < end:
                cut = start
                break
        if len(buf) - cut > MAX_HOLD_CHARS:
            # Too long to wait for: mask the candidate start as if it were the secret and pass everything on.
            return self._masked(buf, _merge([*spans, (cut, len(buf))])), ""
        return self._masked(buf[:cut], spans), buf[cut:]

    def _final(self, text: str) -> str:
        """Mask a text whose end is the end: whole secrets, and an unfinished start of one if it is long enough."""
        spans = self._spans(text)
        cut = self._start_of_unfinished(text)
        if cut is not None and _secret_chars(text, cut, len(text)) >= MIN_PARTIAL_AT_END:
            spans = _merge([*spans, (cut, len(text))])
        return self._masked(text, spans)

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """Where secrets occur, as sorted disjoint (start, end) ranges."""
        assert self._full is not None
        spans: list[tuple[int, int]] = []
        for m in self._full.finditer(text):
            start, end = m.start(1), m.end(1)
            if spans and start <= spans[-1][1]:
                if end > spans[-1][1]:
                    spans[-1] = (spans[-1][0], end)
            else:
                spans.append((start, end))
        return spans

    def _start_of_unfinished(self, text: str) -> int | None:
        """Where the earliest start of a secret that the end of ``text`` cut short begins, if any."""
        assert self._start is not None
        m = self._start.search(text)
        return m.start() if m and m.start() < len(text) else None

    def _masked(self, text: str, spans: list[tuple[int, int]]) -> str:
        """``text`` with the secret characters of each span replaced by the mask; breaks and prefixes are kept."""
        if not spans:
            return text
        out: list[str] = []
        pos = 0
        for start, span_end in spans:
            if start >= len(text):
                break
            end = min(span_end, len(text))
            out.append(text[pos:start])
            run = start
            for gap in _GAP_RUN_RE.finditer(text, start, end):
                if gap.start() > run:
                    out.append(self._mask)
                out.append(gap.group())
                run = gap.end()
            if run < end:
                out.append(self._mask)
            pos = end
        out.append(text[pos:])
        return "".join(out)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping or touching ranges merged."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _secret_chars(text: str, start: int, end: int) -> int:
    """How many characters of ``text[start:end]`` are not line breaks, colour codes or actor prefixes."""
    return (end - start) - sum(len(g.group()) for g in _GAP_RUN_RE.finditer(text, start, end))
