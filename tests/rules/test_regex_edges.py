"""The linear subset's corners (outrider/ground/regex.py), pattern by pattern: what each piece of RE2's syntax is
translated to, what the proof of linearity lets in and what it leaves to RE2, and what RE2 refuses, with its whole
message. Each translation is also checked against RE2 itself on every text of up to two characters drawn from the
neighbours of the classes' ends, so an expected Python pattern below is RE2's meaning, not a snapshot."""

from __future__ import annotations

import itertools

import pytest

from outrider.ground import regex

# (pattern, dotall, the Python pattern it is translated to)
TRANSLATED = [
    # literals: re.escape'd, whatever they are; X is no special character (it is mutmut's marker)
    ("", False, ""),
    ("X", False, "X"),
    ("a", False, "a"),
    (" ", False, "\\ "),
    ("é", False, "é"),
    ("\x00", False, "\x00"),
    ("\n", False, "\\\n"),
    (r"\\", False, "\\\\"),  # an escaped backslash
    # Perl classes, as RE2 means them (ASCII; \s without \v), and `.` with and without dotall
    (r"\d", False, "[0-9]"),
    (r"\D", False, "[\\U00000000-/:-\\U0010ffff]"),
    (r"\w", False, "[0-9A-Z_a-z]"),
    (r"\W", False, "[\\U00000000-/:-@\\[-\\^`\\{-\\U0010ffff]"),
    (r"\s", False, "[\\U00000009-\\U0000000a\\U0000000c-\\U0000000d\\U00000020]"),
    (r"\S", False, "[\\U00000000-\\U00000008\\U0000000b\\U0000000e-\\U0000001f!-\\U0010ffff]"),
    (".", False, "[\\U00000000-\\U00000009\\U0000000b-\\U0010ffff]"),
    (".", True, "[\\U00000000-\\U0010ffff]"),
    # classes: ranges sorted and merged where they touch or overlap, kept apart where they do not
    ("[abc]", False, "[a-c]"),
    ("[ac]", False, "[ac]"),
    ("[a-cd-f]", False, "[a-f]"),
    ("[a-ce-f]", False, "[a-ce-f]"),
    ("[a-zb-c]", False, "[a-z]"),
    ("[b-ca-z]", False, "[a-z]"),
    ("[a-cb-e]", False, "[a-e]"),
    ("[a-a]", False, "[a]"),
    # a leading `]` is a member, a `-` first or last is one, escapes inside a class
    ("[]a]", False, "[\\]a]"),
    ("[^]a]", False, "[\\U00000000-\\\\\\^-`b-\\U0010ffff]"),
    ("[a-]", False, "[\\-a]"),
    ("[a-]b", False, "[\\-a]b"),
    ("[-a]", False, "[\\-a]"),
    (r"[\]]", False, "[\\]]"),
    (r"[\\]", False, "[\\\\]"),
    (r"[\^]", False, "[\\^]"),
    ("[^a]", False, "[\\U00000000-`b-\\U0010ffff]"),
    (r"[\d\s]", False, "[\\U00000009-\\U0000000a\\U0000000c-\\U0000000d\\U000000200-9]"),
    (r"[\d-z]", False, "[\\-0-9z]"),  # a Perl class cannot start a range: the `-` is a member
    (r"[a\-z]", False, "[\\-az]"),
    ("[%--]", False, "[%-\\-]"),
    ("[--/]", False, "[\\--/]"),
    (r"[\.-\:]", False, "[\\.-:]"),
    # printable ASCII written as itself (from ! to ~), the rest as \U escapes; the ends of the code points
    ("[!]", False, "[!]"),
    ("[ ~]", False, "[\\U00000020\\~]"),
    ("[\x7f]", False, "[\\U0000007f]"),
    ("[\U0010ffff]", False, "[\\U0010ffff]"),
    ("[^\U0010ffff]", False, "[\\U00000000-\\U0010fffe]"),
    ("[^\x00]", False, "[\\U00000001-\\U0010ffff]"),
    ("[^\x00-\U0010fffe]", False, "[\\U0010ffff]"),
    ("[é-ü]", False, "[\\U000000e9-\\U000000fc]"),
    ("[^\n]", False, "[\\U00000000-\\U00000009\\U0000000b-\\U0010ffff]"),
    ("[^\x00-\x09\x0b-\U0010ffff]", False, "[\\U0000000a]"),
    # repeats: the short forms where Python has them, {m,n} written out otherwise
    ("a*", False, "a*"),
    ("a+", False, "a+"),
    ("a?", False, "a?"),
    ("a{2}", False, "a{2,2}"),
    ("a{2,}", False, "a{2,}"),
    ("a{2,5}", False, "a{2,5}"),
    ("a{0,1}", False, "a?"),
    ("a{1}", False, "a"),
    ("a{1,1}", False, "a"),
    ("a{0,}", False, "a*"),
    ("a{1,}", False, "a+"),
    ("a{0}", False, "a{0,0}"),
    ("a{0,0}", False, "a{0,0}"),
    ("a{100}", False, "a{100,100}"),  # MAX_REPEAT
    ("a{100,}", False, "a{100,}"),
    ("a{0,100}", False, "a{0,100}"),
    ("a{10,20}", False, "a{10,20}"),
    ("[ab]{3}", False, "[a-b]{3,3}"),
    (r"\d{2,3}", False, "[0-9]{2,3}"),
    (".{2}", True, "[\\U00000000-\\U0010ffff]{2,2}"),
    # groups, capturing or not, empty ones, nested ones
    ("(a)", False, "(a)"),
    ("(?:a|b)", False, "(?:a|b)"),
    ("(ab)(cd)", False, "(ab)(cd)"),
    ("()", False, "()"),
    ("(?:)", False, "(?:)"),
    ("(a?)b", False, "(a?)b"),  # one branch that can match nothing is one way to match
    ("(a|b)c", False, "(a|b)c"),
    ("(?:ab)", False, "(?:ab)"),
    ("((a))", False, "((a))"),
    # anchors: the ends of the text, wherever they are written (RE2 without multi-line)
    ("^a$", False, "\\Aa\\Z"),
    ("^", False, "\\A"),
    ("$", False, "\\Z"),
    ("^(a|b)$", False, "\\A(a|b)\\Z"),
    ("a$b", False, "a\\Zb"),
    ("$a", False, "\\Za"),
    ("(^a)", False, "(\\Aa)"),
    ("b(^a)", False, "b(\\Aa)"),
    # top-level alternation, empty branches included (each is tried once)
    ("a|b", False, "a|b"),
    ("|a", False, "|a"),
    ("a|", False, "a|"),
    ("a|b|c", False, "a|b|c"),
    ("||", False, "||"),
    ("a*|a*a", False, "a*|a*a"),
    # the linearity proof's yeses: repeats whose followers differ, one free overlap per top-level branch followed by
    # literals and one last repeat that cannot fail, branches that start alike with only literals after them
    ("a*a", False, "a*a"),
    ("aaa", False, "aaa"),  # only a repeat's overlap with its follower counts
    ("(aa)", False, "(aa)"),
    ("a*b*", False, "a*b*"),
    ("a*$a", False, "a*\\Za"),
    (".*outrider.*", True, "[\\U00000000-\\U0010ffff]*outrider[\\U00000000-\\U0010ffff]*"),
    (".*outrider", False, "[\\U00000000-\\U00000009\\U0000000b-\\U0010ffff]*outrider"),
    (".*a.+", True, "[\\U00000000-\\U0010ffff]*a[\\U00000000-\\U0010ffff]+"),
    (".*a.{2,}", True, "[\\U00000000-\\U0010ffff]*a[\\U00000000-\\U0010ffff]{2,}"),
    ("[a-z]+[0-9]+", False, "[a-z]+[0-9]+"),
    ("(h|s|v|xv)d[a-z]+", False, "(h|s|v|xv)d[a-z]+"),
    ("(ab|ac)", False, "(ab|ac)"),
    ("(ab|ac)d", False, "(ab|ac)d"),
    ("((ab|ac)d)", False, "((ab|ac)d)"),
    ("^(a|b)c", False, "\\A(a|b)c"),
    ("(a*)", False, "(a*)"),
    ("(a*)b", False, "(a*)b"),
    ("(a*b?c)", False, "(a*b?c)"),
    ("(a*b?)c", False, "(a*b?)c"),
    ("(a*$b)", False, "(a*\\Zb)"),
    ("(a*(?:b|c))", False, "(a*(?:b|c))"),
    ("(a*(?:b|c)a)", False, "(a*(?:b|c)a)"),  # a group that cannot match nothing ends the follower's search
    ("(a*(?:b?)c)", False, "(a*(?:b?)c)"),
    ("([b-c]+a)", False, "([b-c]+a)"),  # the class's ends against its follower's
    ("([a-c]+d)", False, "([a-c]+d)"),
]


@pytest.mark.parametrize(("pattern", "dotall", "python"), TRANSLATED)
def test_each_piece_of_the_subset_is_translated_to_its_python_pattern(pattern: str, dotall: bool,
                                                                      python: str) -> None:
    assert regex.linear_subset(pattern, dotall) == python
    compiled = regex.compile(pattern, dotall=dotall)
    assert isinstance(compiled, regex.LinearPattern)
    assert (compiled.pattern, compiled.python) == (pattern, python)


# the neighbours of every class's ends, the anchors' and escapes' characters, both ends of the code points
ALPHABET = "ab cdefz/09:@AZ[\\]^_`{~\x7f-.%!\n\t\x0b\x0c\r\x00\x08\x0e\x1féüxrv\U0010fffe\U0010ffff"
TEXTS = ["".join(t) for n in range(3) for t in itertools.product(ALPHABET, repeat=n)] + [
    "aaa", "aab", "abc", "abd", "acd", "cd", "abcd", "aaab", "aaaa", "bbba", "ccca", "bcad", "outrider", "xoutrider",
    "xoutriderx", "x\noutrider", "outrider\n", "aaaaa", "ab12", "hdz", "xvdab", "sdq", "vd", "xva", "aac", "aba"]


@pytest.mark.parametrize(("pattern", "dotall"), sorted({(p, d) for p, d, _ in TRANSLATED}))
def test_each_translation_answers_as_re2(pattern: str, dotall: bool) -> None:
    """fullmatch and match, their spans and groups, on every text of TEXTS."""
    ours, theirs = regex.compile(pattern, dotall=dotall), regex._re2(pattern, dotall)
    for text in TEXTS:
        for how in ("fullmatch", "match"):
            a, b = getattr(ours, how)(text), getattr(theirs, how)(text)
            assert (a is None) == (b is None), (how, text)
            if a is not None:
                assert (a.group(0), a.groups()) == (b.group(0), b.groups()), (how, text)


# (pattern, dotall): outside the subset, and RE2 takes them
LEFT_TO_RE2 = [
    # the proof's noes: an overlap where something follows in the group, or a second one; anchors skipped to find
    # the follower; optional pieces looked through; a nullable group looked through
    ("(a*a)", False), ("([a-c]+c)", False), ("([b-c]+b)", False), ("(a*$a)", False), ("(a*b?a)", False),
    ("(a*(?:b|a))", False), ("(a*(?:b?)a)", False), ("(a*b?)a", False), ("(a*)a", False), ("a*ab*b", False),
    # a free overlap followed by anything but literals and one last repeat that cannot fail
    (".*a.?", True), (".*a[^b]*", True), (".*a.*b", True), (".*a(b)", True), (".*a.*", False),
    # a group of several branches one of which matches nothing
    ("(a|)", False), ("(|a)", False), ("(a?|b)", False),
    # branches that start alike with more than literals after them, or inside a group something follows
    ("(ab|ac)(d)", False), ("(ab|ac)d*", False), ("((ab|ac))d", False), ("((ab|ac)d)e", False),
    ("(ab|ac).*", True), ("(ab|ba|ac)(d)", False), ("^(a|a)(b)", False),
    # `^` anywhere but first: \A there is what RE2 means, but then the proof's shape is lost
    ("a^b", False), ("a^", False),
    # counts above MAX_REPEAT, and the forms RE2 reads as text
    ("a{101}", False), ("a{0,101}", False), ("a{101,}", False), ("a{1000}", False), ("a{,3}", False), ("a{", False),
    ("a{2", False), ("a{1,2", False), ("a{1a}", False), ("{", False), ("}", False), ("a]", False), ("a}", False),
    # repeats of repeats, of groups and of anchors; lazy forms
    ("a*?", False), ("a+?", False), ("a??", False), ("a{2}?", False), ("(a)*", False), ("(?:a)+", False),
    ("^*", False), ("$*", False),
    # flags, named groups, escapes other than \d \w \s and punctuation, classes in classes, an empty class
    ("(?i)a", False), ("(?P<n>a)", False), ("[[]", False), ("[a[]", False), ("[[:alpha:]]", False),
    (r"[\n]", False), (r"\n", False), (r"\b", False), (r"\pL", False), (r"\x41", False),
    (r"[\x41]", False), ("[^\x00-\U0010ffff]", False),
    # nested past Python's recursion limit (RE2 nests to 1,000)
    ("(" * 500 + "a" + ")" * 500, False),
]


@pytest.mark.parametrize(("pattern", "dotall"), LEFT_TO_RE2)
def test_what_the_subset_leaves_out_is_matched_by_re2(pattern: str, dotall: bool) -> None:
    assert regex.linear_subset(pattern, dotall) is None
    compiled = regex.compile(pattern, dotall=dotall)
    assert not isinstance(compiled, regex.LinearPattern)
    theirs = regex._re2(pattern, dotall)
    for text in TEXTS:
        assert (compiled.fullmatch(text) is None) == (theirs.fullmatch(text) is None), text


# pattern -> RE2's reason, as the whole message quotes it
REFUSED = {
    "(a": "missing ): (a",
    "(?:a": "missing ): (?:a",
    "a)": "unexpected ): a)",
    "[a": "missing ]: [a",
    "[]": "missing ]: []",
    "[^]": "missing ]: [^]",
    "[a-": "missing ]: [a-",
    "[b-a]": "invalid character class range: b-a",
    "[a-zb-a]": "invalid character class range: b-a",  # not hidden by the range around it
    r"[a-\d]": r"invalid escape sequence: \d",
    "[é-a]": "invalid character class range: é-a",
    r"\é": r"invalid escape sequence: \é",
    "(?": "invalid perl operator: (?",
    "(?=a)": "invalid perl operator: (?=",
    "(?<!a)b": "invalid perl operator: (?<!",
    r"(a)\1": r"invalid escape sequence: \1",
    "a\\": "trailing \\",
    "*a": "no argument for repetition operator: *",
    "+": "no argument for repetition operator: +",
    "?": "no argument for repetition operator: ?",
    "a|*": "no argument for repetition operator: *",
    "a**": "bad repetition operator: **",
    "a{2}{3}": "bad repetition operator: {2}{3}",
    "a{3,2}": "invalid repetition size: {3,2}",
    "a{1001}": "invalid repetition size: {1001}",
}


@pytest.mark.parametrize(("pattern", "reason"), REFUSED.items())
def test_a_pattern_re2_refuses_is_refused_with_its_reason(pattern: str, reason: str,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    assert regex.linear_subset(pattern) is None
    for dotall in (False, True):
        with pytest.raises(regex.RegexError) as e:
            regex.compile(pattern, dotall=dotall)
        assert str(e.value) == f"{pattern!r} is not a regular expression RE2 takes ({reason})"
        assert e.value.__cause__ is None and e.value.__suppress_context__
    assert capfd.readouterr().err == "", "RE2 logs its errors on the process's stderr unless told not to"


def test_a_refused_pattern_is_quoted_to_its_first_80_characters() -> None:
    pattern = "x" * 100 + "("
    with pytest.raises(regex.RegexError) as e:
        regex.compile(pattern)
    assert str(e.value) == f"'{'x' * 80}' is not a regular expression RE2 takes (missing ): {pattern})"


def test_a_pattern_that_is_no_utf_8_is_refused_with_the_codecs_reason() -> None:
    with pytest.raises(regex.RegexError) as e:
        regex.compile("a\ud800")
    assert str(e.value) == ("'a\\ud800' is not a regular expression RE2 takes ('utf-8' codec can't encode "
                            "character '\\ud800' in position 1: surrogates not allowed)")
    assert e.value.__suppress_context__
    with pytest.raises(regex.RegexError) as e:
        regex.compile("x" * 100 + "\ud800")
    assert str(e.value) == (f"'{'x' * 80}' is not a regular expression RE2 takes ('utf-8' codec can't encode "
                            "character '\\ud800' in position 100: surrogates not allowed)")


def test_a_pattern_that_is_no_string_is_not_parsed() -> None:
    assert regex.linear_subset(b"a") is None  # type: ignore[arg-type]


def test_the_subsets_search_is_re2s_with_the_same_dot() -> None:
    """search is unanchored, so it goes to RE2 (compiled at the first search, then kept), `.` as compile said."""
    crossing, within = regex.compile("a.b", dotall=True), regex.compile("a.b")
    assert isinstance(crossing, regex.LinearPattern) and isinstance(within, regex.LinearPattern)
    for _ in range(2):
        found = crossing.search("xxa\nbyy")
        assert found is not None and found.group(0) == "a\nb"
        assert within.search("xxa\nbyy") is None
        found = within.search("xxa-byy")
        assert found is not None and found.group(0) == "a-b"
    assert crossing.match("a\nb") and not within.match("a\nb")


def test_a_pattern_outside_the_subset_keeps_its_dot() -> None:
    for pattern in ("(a.)*b", "(a.)*b$"):
        crossing, within = regex.compile(pattern, dotall=True), regex.compile(pattern)
        assert not isinstance(crossing, regex.LinearPattern)
        assert crossing.fullmatch("a\na-b") and not within.fullmatch("a\na-b")
        assert within.fullmatch("a+a-b")


@pytest.mark.parametrize("c", sorted(regex.LITERAL_ESCAPES))
def test_escaped_punctuation_is_the_character_itself(c: str) -> None:
    for pattern, member in ((f"\\{c}", c), (f"[\\{c}]", c), (f"[\\{c}x]", "x")):
        python = regex.linear_subset(pattern)
        assert python is not None, pattern
        compiled, theirs = regex.compile(pattern), regex._re2(pattern, False)
        assert compiled.fullmatch(member) and theirs.fullmatch(member), pattern
        assert not compiled.fullmatch("y") and not compiled.fullmatch(c + c)


def test_the_expanded_size_counts_each_repeat_at_its_upper_count_or_its_lower_one_when_unbounded() -> None:
    """MAX_EXPANDED, counted piece by piece: a bounded repeat at its upper count, an unbounded one at its lower one
    but at least 1, a group's branches added up, anchors nothing."""
    assert regex.MAX_EXPANDED == 1000
    body = "x{100}y{100}" * 4 + "(?:x{50}|z{49})" + "w{99,}" + "v*" + "$" + "u"  # 800 + 99 + 99 + 1 + 0 + 1 = 1000
    assert regex.linear_subset(body) is not None
    assert regex.linear_subset(body + "t") is None
    for bigger in (body.replace("w{99,}", "w{100,}"), body.replace("v*", "v+t"), body.replace("z{49}", "z{50}"),
                   body.replace("u", "u?t"), body.replace("y{100}", "y{99,100}t", 1)):
        assert regex.linear_subset(bigger) is None, bigger
    for same in (body.replace("v*", "v?"), body.replace("w{99,}", "w{0,99}"), body.replace("u", "u{1,}")):
        assert regex.linear_subset(same) is not None, same
    # top-level branches add up too
    assert regex.linear_subset("a{100}|" * 9 + "b{100}") is not None
    assert regex.linear_subset("a{100}|" * 10 + "b") is None


def test_the_subset_reads_dot_without_dotall_unless_told() -> None:
    """compile's default: `.` stops at a newline, as RE2's does without (?s)."""
    within = "[\\U00000000-\\U00000009\\U0000000b-\\U0010ffff]"
    assert regex.linear_subset(".") == regex.linear_subset(".", False) == within
    assert not regex.compile(".").fullmatch("\n")
