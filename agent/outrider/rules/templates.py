"""Alert label and annotation templates: the subset of Go's text/template that Prometheus rules use.

`{{ $labels.NAME }}`, `{{ $value }}`, `{{ $externalLabels.NAME }}` (also `.Labels.NAME`, `.Value`), string
literals, pipelines (`{{ $value | humanizePercentage }}`) and calls (`{{ printf "%.2f" $value }}`) with
Prometheus's functions: humanize, humanize1024, humanizeDuration, humanizePercentage, humanizeTimestamp, printf,
toUpper, toLower, title. Outputs match Prometheus's to the character (the replayed promtool tests compare them).
A template outside the subset is refused when the rule loads, not when it fires.
"""

from __future__ import annotations

import datetime
import math
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.DOTALL)


class TemplateError(ValueError):
    """A template outside the supported subset; the message says which part."""


def go_g(v: float, prec: int) -> str:
    """Go's %.{prec}g."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"%.{prec}g" % v


def go_v(v: float) -> str:
    """Go's %v for a float64 (strconv 'g', shortest): exponent form from 1e6 on and below 1e-4."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1, v) < 0 else "0"
    sign, digits, exp = Decimal(repr(v)).normalize().as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits))
    point = len(text) + exp  # the decimal exponent + 1
    x = point - 1
    neg = "-" if sign else ""
    if x < -4 or x >= 6:
        mant = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{neg}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    if point <= 0:
        return f"{neg}0.{'0' * -point}{text}"
    if point >= len(text):
        return f"{neg}{text}{'0' * (point - len(text))}"
    return f"{neg}{text[:point]}.{text[point:]}"


def humanize(v: float) -> str:
    if v == 0 or math.isnan(v) or math.isinf(v):
        return go_g(v, 4)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return go_g(v, 4) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return go_g(v, 4) + prefix


def humanize1024(v: float) -> str:
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return go_g(v, 4)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return go_g(v, 4) + prefix


def humanize_duration(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return go_g(v, 4)
    if v == 0:
        return go_g(v, 4) + "s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        whole = int(v)
        seconds, minutes = whole % 60, (whole // 60) % 60
        hours, days = (whole // 3600) % 24, whole // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{go_g(v, 4)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{go_g(v, 4)}{prefix}s"


def humanize_percentage(v: float) -> str:
    return go_g(v * 100, 4) + "%"


def humanize_timestamp(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return go_g(v, 4)
    t = datetime.datetime.fromtimestamp(v, tz=datetime.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".") + " +0000 UTC"


def _printf(fmt: str, *args: Any) -> str:
    """Go's printf for the verbs rules use: %s %d %f %g %v %q %% with flags, width and precision."""
    out, i = [], 0
    it = iter(args)
    for m in re.finditer(r"%([-+ #0]*)(\d*)(?:\.(\d+))?([sdfgevqx%])", fmt):
        out.append(fmt[i:m.start()])
        i = m.end()
        flags, width, prec, verb = m.groups()
        if verb == "%":
            out.append("%")
            continue
        arg = next(it, None)
        if verb == "v" or (verb == "s" and not isinstance(arg, str)):
            text = go_v(arg) if isinstance(arg, float) else str(arg)
            out.append(f"%{flags}{width}s" % text)
        elif verb == "q":
            out.append('"' + str(arg).replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif verb == "d":
            out.append(f"%{flags}{width}d" % int(float(arg)))  # type: ignore[arg-type]
        else:
            spec = f"%{flags}{width}{'.' + prec if prec else ''}{verb}"
            value = float(arg)  # type: ignore[arg-type]
            out.append(go_g(value, 4) if not math.isfinite(value) else spec % value)
    out.append(fmt[i:])
    return "".join(out)


FUNCTIONS: dict[str, Callable[..., str]] = {
    "humanize": lambda v: humanize(_float(v)),
    "humanize1024": lambda v: humanize1024(_float(v)),
    "humanizeDuration": lambda v: humanize_duration(_float(v)),
    "humanizePercentage": lambda v: humanize_percentage(_float(v)),
    "humanizeTimestamp": lambda v: humanize_timestamp(_float(v)),
    "printf": _printf,
    "toUpper": lambda s: str(s).upper(),
    "toLower": lambda s: str(s).lower(),
    "title": lambda s: str(s).title(),
}


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise TemplateError(f"expected a number, got {v!r}") from None


@dataclass(frozen=True)
class _Operand:
    kind: str  # value, label, external, literal
    name: str = ""


Command = tuple[str, list[_Operand]]  # (function name or "", operands)


def _operand(token: str, where: str) -> _Operand:
    if token in ("$value", ".Value"):
        return _Operand("value")
    for prefix, kind in (("$labels.", "label"), (".Labels.", "label"), ("$externalLabels.", "external"),
                         (".ExternalLabels.", "external")):
        if token.startswith(prefix) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token[len(prefix):]):
            return _Operand(kind, token[len(prefix):])
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "\"`":
        return _Operand("literal", token[1:-1])
    if re.fullmatch(r"-?\d+(\.\d+)?", token):
        return _Operand("literal", token)
    raise TemplateError(f"{where}: unsupported template operand {token!r} (supported: $value, $labels.NAME, "
                        "$externalLabels.NAME, string literals)")


class Template:
    """A parsed template; `render(labels, value)` fills it in."""

    def __init__(self, text: str, where: str = "template") -> None:
        self.text = text
        self.parts: list[str | list[Command]] = []
        pos = 0
        for m in ACTION.finditer(text):
            literal = text[pos:m.start()]
            if m.group(1):
                literal = literal.rstrip()
            if self.parts and isinstance(self.parts[-1], str) and self.parts[-1] == "\x00trim":
                self.parts.pop()
                literal = literal.lstrip()
            self.parts.append(literal)
            self.parts.append(self._pipeline(m.group(2), where))
            if m.group(3):
                self.parts.append("\x00trim")
            pos = m.end()
        tail = text[pos:]
        if self.parts and self.parts[-1] == "\x00trim":
            self.parts.pop()
            tail = tail.lstrip()
        if "{{" in tail:
            raise TemplateError(f"{where}: unclosed '{{{{'")
        self.parts.append(tail)

    @staticmethod
    def _pipeline(body: str, where: str) -> list[Command]:
        if re.match(r"^(if|range|with|define|template|block|end|else)\b|^\$\w+\s*:?=", body):
            raise TemplateError(f"{where}: control structures and variables are not supported ({{{{ {body} }}}})")
        commands: list[Command] = []
        for i, segment in enumerate(_split_pipes(body)):
            try:
                tokens = shlex.split(segment.replace("`", '"'), posix=False)
            except ValueError:
                raise TemplateError(f"{where}: cannot read {{{{ {body} }}}}") from None
            if not tokens:
                raise TemplateError(f"{where}: empty command in {{{{ {body} }}}}")
            head, rest = tokens[0], tokens[1:]
            if head in FUNCTIONS:
                commands.append((head, [_operand(t, where) for t in rest]))
            elif i == 0 and not rest:
                commands.append(("", [_operand(head, where)]))
            else:
                raise TemplateError(f"{where}: unsupported template function {head!r} (supported: "
                                    f"{', '.join(FUNCTIONS)})")
        return commands

    def render(self, labels: Mapping[str, str], value: float,
               external_labels: Mapping[str, str] | None = None) -> str:
        """The filled-in text; a failure (printf with a bad argument) gives Prometheus's error text instead."""
        try:
            return self._render(labels, value, external_labels)
        except Exception as e:
            return f"<error expanding template: {type(e).__name__}: {e}>"

    def _render(self, labels: Mapping[str, str], value: float,
                external_labels: Mapping[str, str] | None = None) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            current: Any = None
            for i, (fn, operands) in enumerate(part):
                args = [_resolve(o, labels, value, external_labels or {}) for o in operands]
                if i > 0:
                    args.append(current)
                current = FUNCTIONS[fn](*args) if fn else args[0]
            out.append(go_v(current) if isinstance(current, float) else str(current))
        return "".join(out)


def _resolve(o: _Operand, labels: Mapping[str, str], value: float, external: Mapping[str, str]) -> Any:
    if o.kind == "value":
        return value
    if o.kind == "label":
        return labels.get(o.name, "")
    if o.kind == "external":
        return external.get(o.name, "")
    return o.name


def _split_pipes(body: str) -> list[str]:
    parts, current, quote = [], [], ""
    for ch in body:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
        elif ch in "\"`":
            quote = ch
            current.append(ch)
        elif ch == "|":
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return parts
