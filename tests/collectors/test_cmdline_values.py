"""Command-line redaction (collectors/cmdline.py) at its edges: each rule's boundary, a secret form beside another
in one argument, values that end the argument, and what a Python interpreter's options take. Pure functions, in
process; tests/collectors/test_command_redaction.py has the forms people write and real processes' labels."""

from __future__ import annotations

import pytest

from outrider.collectors.cmdline import REDACTED, _python_target, program, redact

R = REDACTED


@pytest.mark.parametrize(("argv", "expected"), [
    # a whole value goes, whatever it holds: a space, a ; or a quote would end a value found inside an argument
    (["app", "--password=correct horse;battery"], ["app", f"--password={R}"]),
    (["env", "DB_PASSWORD=p a;s s"], ["env", f"DB_PASSWORD={R}"]),
    # a name with a dash is no variable: its value is found inside the argument
    (["app", "db-password=hunter2"], ["app", f"db-password={R}"]),
    (["app", "db-password="], ["app", "db-password="]),  # nothing to hide
    # an option whose name starts with p is no glued password
    (["app", "-pool=4", "-port=80"], ["app", "-pool=4", "-port=80"]),
])
def test_each_form_takes_its_whole_value_and_only_its_own(argv: list[str], expected: list[str]) -> None:
    assert redact(argv) == expected


@pytest.mark.parametrize("argv", [
    ["app", "--token=x", "report.txt"],
    ["mysql", "-pX", "db"],
    ["curl", "-H", "Authorization: Bearer x", "https://h/x"],
    ["env", "API_KEY=x", "train.py"],
])
def test_a_redacted_value_given_with_its_name_leaves_the_next_argument_alone(argv: list[str]) -> None:
    assert redact(argv)[-1] == argv[-1]


@pytest.mark.parametrize(("arg", "expected"), [
    # spaces on either side of the colon
    ('{"password" : "x"}', f'{{"password" : "{R}"}}'),
    ('{"password"\t:\t"x"}', f'{{"password"\t:\t"{R}"}}'),
    # two quoted secrets in one argument, the second after the first's closing quote
    ('{"token": "a", "user": "u", "password": "b"}', f'{{"token": "{R}", "user": "u", "password": "{R}"}}'),
    # an empty quoted value keeps its closing quote; the next key is read as a key
    ('{"password": "", "user": "u"}', f'{{"password": "{R}", "user": "u"}}'),
    # an unterminated quote: the rest of the argument is the value
    ('{"password": "abc', f'{{"password": "{R}'),
    # a key cut from its opening quote (a JSON the shell split) is still a key
    ('password": "hunter2"', f'password": "{R}"'),
    ("token': 'x'", f"token': '{R}'"),
    # a quoted name followed by more letters is another name, not a secret one
    ('"token"X: "abc"', '"token"X: "abc"'),
])
def test_keys_inside_an_argument(arg: str, expected: str) -> None:
    assert redact(["app", arg]) == ["app", expected]


@pytest.mark.parametrize(("arg", "expected"), [
    # each URL of an argument
    ("https://u:p1@a.example/x https://v:p2@b.example/y", f"https://u:{R}@a.example/x https://v:{R}@b.example/y"),
    # the authority runs to the argument's end
    ("https://ghp_x@github.com", f"https://{R}@github.com"),
    # a port after a token: the token goes whole, the port stays
    ("https://ghp_t@github.com:443/o/r.git", f"https://{R}@github.com:443/o/r.git"),
    # a password with a colon in it: the user is what comes before the first
    ("https://u:p:q@h/x", f"https://u:{R}@h/x"),
    # an @ in the path, after the authority, is no userinfo
    ("https://example.com/users/@me", "https://example.com/users/@me"),
    # an empty userinfo has nothing to hide
    ("https://@host/x", "https://@host/x"),
    # upper-case letters in the userinfo
    ("https://ci-bot:XYZ@h/x", f"https://ci-bot:{R}@h/x"),
    # no scheme before ://
    ("://svc:pw@db", f"://svc:{R}@db"),
])
def test_url_userinfo(arg: str, expected: str) -> None:
    assert redact(["app", arg]) == ["app", expected]


@pytest.mark.parametrize(("args", "expected"), [
    (["train.py", "--lr", "1"], (["train.py"], ["--lr", "1"])),
    (["-u", "train.py", "x"], (["train.py"], ["x"])),
    (["-", "x.py"], ([], ["x.py"])),  # the script from stdin: nothing to show
    (["-m", "pkg", "a"], (["-m", "pkg"], ["a"])),
    (["-m", "pkg"], (["-m", "pkg"], [])),
    (["-mpkg", "a", "b"], (["-m", "pkg"], ["a", "b"])),
    (["-m"], (["-m", ""], [])),  # -m without its module (Python refuses it)
    (["-u", "-X"], ([], [])),
    (["-X", "dev", "serve.py"], (["serve.py"], [])),
    (["-Wd", "serve.py"], (["serve.py"], [])),
    (["-c"], (["-c"], [])),
    (["-u", "--check-hash-based-pycs", "always", "--isolated", "train.py", "a"], (["train.py"], ["a"])),
    (["--check-hash-based-pycs", "always", "train.py"], (["train.py"], [])),
    ([], ([], [])),
])
def test_what_a_python_interpreters_arguments_run(args: list[str], expected: tuple[list[str], list[str]]) -> None:
    assert _python_target(args) == expected


@pytest.mark.parametrize(("argv", "expected"), [
    (["python", "-", "secret.py"], ["python"]),
    (["python", "-mhttp.server"], ["python", "-m", "http.server"]),
    # options are no scripts, whatever they end with, nor are assignments
    (["launcher", "-script.py", "cfg=a.py", "train.py"], ["launcher", "train.py"]),
    # the executable's path is kept as it is (but for a URL's userinfo)
    (["/srv/token=1/bin/app", "train.py"], ["/srv/token=1/bin/app", "train.py"]),
])
def test_the_program_and_its_script(argv: list[str], expected: list[str]) -> None:
    assert program(argv) == expected
