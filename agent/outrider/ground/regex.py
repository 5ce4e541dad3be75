"""Regular expressions from rules and configuration, matched in linear time.

Prometheus matches label regexes with RE2, whose automaton runs in time linear in the input whatever the pattern;
Python's `re` backtracks, and a pattern such as `([a-z_]+)+_slow` against a 25-character label value takes seconds
to fail (exponential in the value's length). Every user-written regex of the agent (rule matchers `=~` / `!~`,
`label_replace`, receivers' `match_re`, the host collector's device filters) is compiled here, and matched in
linear time whatever it is. RE2 refuses what it cannot match in linear time (backreferences, lookaround); such a
pattern is refused when it loads, with `RegexError` naming it, never at evaluation. The syntax is RE2's,
Prometheus's own: a rule file Prometheus takes compiles here the same way.

Two engines, one answer:

- **Linear by construction, with Python's `re`** (`linear_subset`): a pattern this module parses itself and proves
  cannot take a backtracking matcher more than linear time in the text, translated into an equivalent Python
  pattern (`\\d` as `[0-9]`, `^`/`$` as `\\A`/`\\Z`, the ends of the text, as RE2 means them). The proof is
  structural, for `fullmatch` and `match` (anchored at the start):
  - quantifiers (`*`, `+`, `?`, `{m,n}`) only on one character (a literal, `.`, a class), never on a group;
  - a quantified character shares no character with what can come right after it, so the matcher never has to
    give one back and try again (`[a-z]+\\d+`, `(h|s|v|xv)d[a-z]+`);
  - at most one quantified character per branch breaks that rule (`.*outrider.*`), and then only literals, classes
    and one final `.*` may follow it: it is tried at each of at most n places, each costing the length of the
    literals;
  - the branches of a group start with characters no other branch of it starts with, and none matches nothing (one
    branch can match at each place), unless only literals and classes follow the group; the pattern's own
    top-level branches may overlap (each is tried once);
  - no flags, named groups, lookaround, backreferences or escapes other than `\\d \\w \\s` and escaped
    punctuation; counts as RE2 reads them (`{01}` and `{٣}` are text there, so they go to RE2); at most
    `MAX_EXPANDED` characters with every count written out, and UTF-8 only (what RE2 would refuse is refused at
    load, by RE2).

  The time is linear in the text, times the pattern's length, which is why patterns longer than `MAX_PATTERN`
  go to RE2 (a 400-branch alternation of `.*errNNN`, 3,600 characters, took 270 ms on a 160,000-character value,
  RE2 0.4 ms; the longest built-in pattern has 23 branches of 1 to 6 characters).

  The built-in rules' matchers and the host collector's default filters are all in this subset: the agent on its
  defaults never loads RE2 (2.5 MiB of RSS: the binding and libstdc++; docs/cost.md).
- **RE2** (the `google-re2` binding, imported at the first pattern that needs it) for everything else, and for
  `search` on any pattern (unanchored, a backtracking matcher would start again at each place).

tests/rules/test_regex.py compares the two on every built-in pattern and on generated ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

ENGINE = "re2"  # what matches outside the linear subset: tests assert it, so a backtracking engine cannot slip in
MAX_CODEPOINT = 0x10FFFF
MAX_PATTERN = 1024  # longer patterns go to RE2 unparsed
MAX_REPEAT = 100  # {m,n} with n above it goes to RE2
MAX_EXPANDED = 1000  # characters matched by the pattern's atoms at their upper counts: RE2 refuses what is far larger
_COUNTS = re.compile(r"(0|[1-9][0-9]{0,2})(?:(,)(0|[1-9][0-9]{0,2})?)?}", re.ASCII)


class RegexError(ValueError):
    """A pattern RE2 does not take (bad syntax, or a construct without a linear-time match)."""


class Match(Protocol):
    def group(self, group: int | str, /) -> Any: ...
    def expand(self, template: str) -> str: ...


class Pattern(Protocol):
    pattern: str

    def fullmatch(self, text: str) -> Match | None: ...
    def match(self, text: str) -> Match | None: ...
    def search(self, text: str) -> Match | None: ...


def compile(pattern: str, *, dotall: bool = False) -> Pattern:  # as re.compile, by intent
    """The pattern compiled for a linear-time match; `dotall`: `.` matches a newline too (Prometheus's label
    matchers)."""
    python = linear_subset(pattern, dotall)
    if python is not None:
        return LinearPattern(pattern, python, dotall)
    return _re2(pattern, dotall)


def _re2(pattern: str, dotall: bool) -> Pattern:
    import re2  # type: ignore[import-untyped]  # google-re2 ships no type information; loaded when first needed

    options = re2.Options()
    options.log_errors = False  # the error is raised, not printed on the workload's stderr
    options.dot_nl = dotall
    try:
        return re2.compile(pattern, options)  # type: ignore[no-any-return]
    except re2.error as e:
        reason = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise RegexError(f"{pattern[:80]!r} is not a regular expression RE2 takes ({reason})") from None
    except (TypeError, ValueError) as e:
        raise RegexError(f"{pattern[:80]!r} is not a regular expression RE2 takes ({e})") from None


class LinearPattern:
    """A pattern of the linear subset: fullmatch and match through Python's re, search through RE2."""

    __slots__ = ("_compiled", "_dotall", "_search", "pattern", "python")

    def __init__(self, pattern: str, python: str, dotall: bool) -> None:
        self.pattern = pattern
        self.python = python
        self._dotall = dotall
        self._compiled = re.compile(python)  # no flag: the translation spells `.` out as a class, dotall or not
        self._search: Pattern | None = None

    def fullmatch(self, text: str) -> Match | None:
        return self._compiled.fullmatch(text)

    def match(self, text: str) -> Match | None:
        return self._compiled.match(text)

    def search(self, text: str) -> Match | None:
        if self._search is None:
            self._search = _re2(self.pattern, self._dotall)
        return self._search.search(text)


# --- the linear subset -------------------------------------------------------------------------------------------

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive code point ranges


def _normal(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _complement(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in ranges:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CODEPOINT:
        out.append((at, MAX_CODEPOINT))
    return tuple(out)


def _meet(a: Ranges, b: Ranges) -> bool:
    return any(lo1 <= hi2 and lo2 <= hi1 for lo1, hi1 in a for lo2, hi2 in b)


def _char_class(ranges: Ranges) -> str:
    parts = []
    for lo, hi in ranges:
        parts.append(_escape_in_class(lo) if lo == hi else f"{_escape_in_class(lo)}-{_escape_in_class(hi)}")
    return "[" + "".join(parts) + "]"


def _escape_in_class(cp: int) -> str:
    return re.escape(chr(cp)) if 32 < cp < 127 else f"\\U{cp:08x}"


DIGIT: Ranges = ((48, 57),)
WORD: Ranges = _normal([(48, 57), (65, 90), (95, 95), (97, 122)])
SPACE: Ranges = _normal([(9, 10), (12, 13), (32, 32)])  # RE2's \s: [\t\n\f\r ]
PERL = {"d": DIGIT, "w": WORD, "s": SPACE, "D": _complement(DIGIT), "W": _complement(WORD), "S": _complement(SPACE)}
LITERAL_ESCAPES = frozenset(r"""\.+*?()|[]{}^$-/:_,=!"'#%&<>@`~;""")


@dataclass(frozen=True)
class Atom:
    chars: Ranges  # the characters it matches
    python: str  # as a Python pattern
    low: int = 1  # repeated low..high times (high None: unbounded)
    high: int | None = 1

    @property
    def quantified(self) -> bool:
        return (self.low, self.high) != (1, 1)

    @property
    def nullable(self) -> bool:
        return self.low == 0


@dataclass(frozen=True)
class Group:
    branches: tuple[tuple[Item, ...], ...]
    capturing: bool


@dataclass(frozen=True)
class Anchor:
    python: str  # \A or \Z (Python's \Z: the very end, RE2's $ without multi-line)


Item = Atom | Group | Anchor


class _NotLinear(Exception):
    pass


class _Parser:
    def __init__(self, text: str, dotall: bool) -> None:
        self.text = text
        self.at = 0
        self.dot: Ranges = ((0, MAX_CODEPOINT),) if dotall else _complement(((10, 10),))

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def take(self) -> str:
        c = self.peek()
        if not c:
            raise _NotLinear
        self.at += 1
        return c

    def alternation(self) -> tuple[tuple[Item, ...], ...]:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        return tuple(branches)

    def sequence(self) -> tuple[Item, ...]:
        items: list[Item] = []
        while self.peek() not in ("", "|", ")"):
            item = self.item()
            if self.peek() in ("*", "+", "?", "{"):
                if not isinstance(item, Atom):
                    raise _NotLinear  # a quantified group or anchor
                item = self.quantifier(item)  # a quantifier right after it (lazy, possessive) is refused by item()
            items.append(item)
        return tuple(items)

    def quantifier(self, atom: Atom) -> Atom:
        c = self.take()
        if c == "{":
            m = _COUNTS.match(self.text, self.at)  # RE2 reads a count with a leading zero, or none, as text
            if m is None:
                raise _NotLinear
            self.at = m.end()
            low = int(m.group(1))
            high = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if (high is not None and (high < low or high > MAX_REPEAT)) or low > MAX_REPEAT:
                raise _NotLinear
            return Atom(atom.chars, atom.python, low, high)
        low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        return Atom(atom.chars, atom.python, low, high)

    def item(self) -> Item:
        c = self.take()
        if c == "(":
            capturing = True
            if self.peek() == "?":
                if self.text[self.at:self.at + 2] != "?:":
                    raise _NotLinear  # flags, named groups, lookaround
                self.at += 2
                capturing = False
            branches = self.alternation()
            if self.take() != ")":
                raise _NotLinear
            return Group(branches, capturing)
        if c == ".":
            return Atom(self.dot, _char_class(self.dot))
        if c == "[":
            return self.char_class()
        if c == "\\":
            e = self.take()
            if e in PERL:
                return Atom(PERL[e], _char_class(PERL[e]))
            if e in LITERAL_ESCAPES:
                return Atom(((ord(e), ord(e)),), re.escape(e))
            raise _NotLinear
        if c == "^":
            return Anchor(r"\A")
        if c == "$":
            return Anchor(r"\Z")
        if c in "*+?{}]":
            raise _NotLinear  # RE2 refuses or reads it otherwise (a*?, a**, a{2}{3}, a]): let it say
        return Atom(((ord(c), ord(c)),), re.escape(c))

    def char_class(self) -> Atom:
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            if c == "[":
                raise _NotLinear  # [:alpha:] and the like
            lo = self.class_char(c, ranges)
            if lo is None:
                continue
            if self.peek() == "-" and self.text[self.at + 1:self.at + 2] != "]":  # at the end: take() refuses
                self.at += 1
                hi = self.class_char(self.take(), None)
                if hi is None or hi < lo:
                    raise _NotLinear
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        chars = _normal(ranges)
        if negated:
            chars = _complement(chars)
        if not chars:
            raise _NotLinear
        return Atom(chars, _char_class(chars))

    def class_char(self, c: str, ranges: list[tuple[int, int]] | None) -> int | None:
        """A class member's code point, or None when it was a Perl class added to ranges."""
        if c != "\\":
            return ord(c)
        e = self.take()
        if e in PERL and ranges is not None:
            ranges.extend(PERL[e])
            return None
        if e in LITERAL_ESCAPES:  # the backslash among them
            return ord(e)
        raise _NotLinear


def _first(items: tuple[Item, ...]) -> tuple[Ranges, bool]:
    """The characters the sequence can start with, and whether it can match nothing."""
    chars: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, Anchor):
            continue
        if isinstance(item, Atom):
            chars.extend(item.chars)
            if not item.nullable:
                return _normal(chars), False
            continue
        nullable = False
        for branch in item.branches:
            c, n = _first(branch)
            chars.extend(c)
            nullable = nullable or n
        if not nullable:
            return _normal(chars), False
    return _normal(chars), True


def _plain(items: tuple[Item, ...], final_repeat: bool = False) -> bool:
    r"""Literals, classes and anchors only; with final_repeat, and one last repeat that cannot fail (`.*` with dotall,
    or `[\s\S]*`): what may follow the one quantified character that overlaps its follower."""
    for i, item in enumerate(items):
        if isinstance(item, Group):
            return False
        if isinstance(item, Atom) and item.quantified:
            last = i == len(items) - 1
            if not (final_repeat and last and item.high is None and item.chars == ((0, MAX_CODEPOINT),)):
                return False
    return True


def _check(items: tuple[Item, ...], after: Ranges, free: bool) -> None:
    """Raises _NotLinear where the sequence, followed by characters `after` (none: the end of a top-level branch),
    could make a backtracking matcher backtrack more than linearly in the text (the module's docstring); `free`:
    whether one quantified character may overlap what follows it (top-level branches only)."""
    for i, item in enumerate(items):
        rest = items[i + 1:]
        if isinstance(item, Anchor):
            if item.python == r"\A" and i:
                raise _NotLinear
            continue
        follow, nullable = _first(rest)
        if nullable:
            follow = _normal([*follow, *after])
        if isinstance(item, Atom):
            if item.quantified and _meet(item.chars, follow):
                if not free or not _plain(rest, final_repeat=True):  # free: a top-level branch, nothing after
                    raise _NotLinear
                free = False
            continue
        starts = [_first(b) for b in item.branches]
        if len(starts) > 1 and any(n for _, n in starts):
            raise _NotLinear  # one of several branches can match nothing
        overlapping = any(_meet(a[0], b[0]) for j, a in enumerate(starts) for b in starts[j + 1:])
        if overlapping and (after or not _plain(rest)):
            raise _NotLinear  # branches that start alike, then more that could backtrack into them
        for branch in item.branches:
            _check(branch, follow, False)


def _expanded(branches: tuple[tuple[Item, ...], ...]) -> int:
    """The pattern's size with each repeat written out (at its upper count, or its lower one when unbounded)."""
    total = 0
    for branch in branches:
        for item in branch:
            if isinstance(item, Group):
                total += _expanded(item.branches)
            elif isinstance(item, Atom):
                total += max(item.low if item.high is None else item.high, 1)
    return total


def _emit(items: tuple[Item, ...]) -> str:
    out = []
    for item in items:
        if isinstance(item, Anchor):
            out.append(item.python)
        elif isinstance(item, Group):
            inner = "|".join(_emit(b) for b in item.branches)
            out.append(f"({inner})" if item.capturing else f"(?:{inner})")
        else:
            out.append(item.python + _repeat(item))
    return "".join(out)


def _repeat(atom: Atom) -> str:
    if (atom.low, atom.high) == (1, 1):
        return ""
    if (atom.low, atom.high) == (0, None):
        return "*"
    if (atom.low, atom.high) == (1, None):
        return "+"
    if (atom.low, atom.high) == (0, 1):
        return "?"
    return f"{{{atom.low},{'' if atom.high is None else atom.high}}}"


def linear_subset(pattern: str, dotall: bool = False) -> str | None:
    """The Python pattern that matches as RE2 matches `pattern` and cannot backtrack more than linearly (see the
    module's docstring), or None when `pattern` is not in that subset."""
    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN:
        return None
    try:
        pattern.encode("utf-8")  # RE2 takes UTF-8: a lone surrogate is refused there
    except UnicodeEncodeError:
        return None
    parser = _Parser(pattern, dotall)
    try:
        branches = parser.alternation()
        if parser.at != len(pattern):
            return None  # an unbalanced ")"
        for branch in branches:  # top-level branches are tried one after the other, each once
            _check(branch, (), True)
        if _expanded(branches) > MAX_EXPANDED:
            return None  # RE2 may refuse it as too large: it must say so, at load
    except (_NotLinear, RecursionError):
        return None
    python = "|".join(_emit(b) for b in branches)
    try:
        re.compile(python)
    except re.error:  # pragma: no cover - the emitter writes only what it parsed
        return None
    return python

