"""Regular expressions from rules and configuration, matched in linear time.

Prometheus matches label regexes with RE2, whose automaton runs in time linear in the input whatever the pattern;
Python's `re` backtracks, and a pattern such as `([a-z_]+)+_slow` against a 25-character label value takes seconds
to fail (exponential in the value's length). Every user-written regex of the agent (rule matchers `=~` / `!~`,
`label_replace`, receivers' `match_re`, the host collector's device filters) is compiled here, with Google's RE2
(the `google-re2` binding): no rule or setting can freeze the agent, or the workload it runs in. RE2 refuses what it
cannot match in linear time (backreferences, lookaround); such a pattern is refused when it loads, with
`RegexError` naming it, never at evaluation. The syntax is RE2's, Prometheus's own: a rule file Prometheus takes
compiles here the same way.
"""

from __future__ import annotations

from typing import Any, Protocol

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

ENGINE = "re2"  # what matches: tests assert it, so a fallback to a backtracking engine cannot slip in


class RegexError(ValueError):
    """A pattern RE2 does not take (bad syntax, or a construct without a linear-time match)."""


class Match(Protocol):
    def group(self, *groups: int | str) -> Any: ...
    def expand(self, template: str) -> str: ...


class Pattern(Protocol):
    pattern: str

    def fullmatch(self, text: str) -> Match | None: ...
    def match(self, text: str) -> Match | None: ...
    def search(self, text: str) -> Match | None: ...


def compile(pattern: str, *, dotall: bool = False) -> Pattern:  # as re.compile, by intent
    """The pattern compiled by RE2; `dotall`: `.` matches a newline too (Prometheus's label matchers)."""
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
