"""Final-answer extraction: which part of a response is its answer, and whether that answer is a value.

A reward that hands the whole response to a checker that evaluates expressions can be gamed by restating
the problem ("Calculate -95 / 95." answered with "(-95 / 95)"). Here the answer is read in two steps.

1. The span, by `mode` (a reward component's `options.answer`):
   * "boxed": the content of the last \\boxed{...} (or \\fbox{...}; nested braces are fine);
   * "marked": the text after the last answer marker: <answer>X</answer>, "#### X", "answer: X",
     "answer is X", "final answer: X" (to the end of the line, or the next line when that one is empty),
     or "= X" ending the response;
   * "last_number": the whole response;
   * "auto" (the default): boxed if the response has a box, else marked if it has a marker, else the
     whole response.
2. The value: the last number of the span. A number is an integer (1,234 with thousands commas is one
   number), a decimal, or a fraction literal `a/b` or `\\frac{a}{b}`. It is not an answer, and the
   response has no value, when
   * it is the operand of an operator: the text before it ends in + - * / ^ × ÷ · \\times \\cdot \\div
     (opening brackets aside), so "(-95 / 95)", "0 + 5" and "2^3" have no value, while
     "-95 / 95 = -1" has the value -1 (its last number follows "=");
   * it is a fraction not in lowest terms or with denominator 1 ("-95/95", "\\frac{2}{4}", "6/1"): an
     unevaluated division, not a final answer. "-3/4" and "\\frac{1}{2}" are values.
   A leading "-" is a sign unless it follows a digit, a letter or a closing bracket ("5-3" is an
   expression; "= -1" is the value -1).

Targets are trusted: `parse_value` reads a whole target string leniently (any fraction, "$...$").
For targets that are not a number (latex expressions, words), `final_answer` gives the span text:
the boxed content or marked span, else ("auto") the last non-empty line, or ("last_number") the last
number as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from math import gcd

MODES = ("auto", "boxed", "marked", "last_number")

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_MARKERS = (
    re.compile(r"<answer>(.*?)(?:</answer>|$)", re.IGNORECASE | re.DOTALL),
    re.compile(r"####[ \t]*(.*)"),
    re.compile(r"\b(?:final[ \t]+)?answer[ \t]*(?:is\b[ \t]*:?|:|=)[ \t]*(.*)", re.IGNORECASE),
)
_SENTENCE_END = re.compile(r"\.\s")
_TRAILING_EQ = re.compile(r"=([^=\n]*)\Z")
_FRAC = re.compile(r"(-?)\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_POWER = re.compile(r"(?<=[\d)])\s*\*\*\s*(?=[\d(])")  # 2**3 is a power; other ** are markdown bold
_DROP = ("$", "\\(", "\\)", "\\[", "\\]", "\\left", "\\right", "\\!", "\\,", "\\;", "**", "{,}")
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?![\d,])|\d+")
_OPERATORS = ("+", "-", "*", "/", "^", "×", "÷", "·", "\\times", "\\cdot", "\\div")
_WHOLE_VALUE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/(?:\d{1,3}(?:,\d{3})+|\d+))?")


@dataclass(frozen=True, slots=True)
class Value:
    number: Fraction
    decimal: bool  # written with a decimal point: compared with a tolerance

    def text(self) -> str:
        """Canonical spelling: "-1", "3/4", "0.25" (an integral value is always written as an integer)."""
        if self.number.denominator == 1:
            return str(self.number.numerator)
        if self.decimal:
            return f"{float(self.number):.15g}"
        return f"{self.number.numerator}/{self.number.denominator}"


def check_mode(mode: object) -> str:
    if mode not in MODES:
        raise ValueError(f"options.answer={mode!r}: allowed values are {', '.join(map(repr, MODES))}")
    return mode  # type: ignore[return-value]


def answer_span(response: str, mode: str = "auto") -> str | None:
    """The text the answer is read from (step 1 above); None when `mode` finds no box / marker."""
    found = _span(response, mode)
    return None if found is None else found[0]


def final_value(response: str, mode: str = "auto") -> Value | None:
    """The response's final answer as a value (step 2 above), or None when it has none."""
    span = answer_span(response, mode)
    return None if span is None else _last_value(span)


def final_answer(response: str, mode: str = "auto") -> str | None:
    """The final answer as text, for targets that are not a number (see the module docstring)."""
    found = _span(response, mode)
    if found is None:
        return None
    span, source = found
    if source != "whole":
        return " ".join(span.split()) or None
    if mode == "last_number":
        token = _last_number(span)
        return None if token is None else span[token[0]:token[1]]
    lines = [line.strip() for line in span.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _span(response: str, mode: str) -> tuple[str, str] | None:
    """(span, "boxed" | "marked" | "whole")."""
    text = normalise(response)
    if mode in ("auto", "boxed"):
        boxed = _last_box(text)
        if boxed is not None or mode == "boxed":
            return None if boxed is None else (boxed, "boxed")
    if mode in ("auto", "marked"):
        marked = _last_marked(text)
        if marked is not None or mode == "marked":
            return None if marked is None else (marked, "marked")
    return text, "whole"


def parse_value(text: str) -> Value | None:
    """A whole string (a target) as a value: "-1", "1,234", "0.5", "3/6", "\\frac{1}{2}", "$-3$"."""
    s = normalise(text).strip().rstrip(".").strip()
    if not _WHOLE_VALUE.fullmatch(s):
        return None
    s = s.replace(",", "")
    num, _, den = s.partition("/")
    if den and int(den) == 0:
        return None
    number = Fraction(num) / (Fraction(den) if den else 1)
    return Value(number, decimal="." in num)


def same_value(answer: Value, target: Value, rel_tol: float = 1e-6) -> bool:
    """Exactly equal; or, when either was written as a decimal, equal within `rel_tol` of the target."""
    if answer.number == target.number:
        return True
    if not (answer.decimal or target.decimal):
        return False
    return abs(answer.number - target.number) <= rel_tol * max(1, abs(target.number))


def normalise(text: str) -> str:
    """Latex and markdown noise removed: \\frac{a}{b} -> a/b, \\text{x} -> x, $, **, unicode minus."""
    text = text.replace("\u2212", "-")
    text = _FRAC.sub(lambda m: _frac_literal(m[1], m[2], m[3]), text)
    text = _TEXT.sub(lambda m: f" {m[1]} ", text)
    text = _POWER.sub("^", text).replace("\\ ", " ")
    for drop in _DROP:
        text = text.replace(drop, "")
    return text


def _frac_literal(outer: str, num: str, den: str) -> str:
    negative = (outer == "-") != num.startswith("-")
    return f"{'-' if negative else ''}{num.lstrip('-')}/{den}"


def _last_box(text: str) -> str | None:
    starts = list(_BOX.finditer(text))
    for m in reversed(starts):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[m.end():i - 1]
    return None


def _last_marked(text: str) -> str | None:
    best: tuple[int, str] | None = None
    for pattern in _MARKERS:
        for m in pattern.finditer(text):
            span = m[1].strip() or _next_line(text, m.end())
            if pattern is not _MARKERS[0]:
                span = _SENTENCE_END.split(span, 1)[0].strip()  # "answer is 7. Check: 3+4" reads "7"
            if span and (best is None or m.start() >= best[0]):
                best = (m.start(), span)
    stripped = text.rstrip().rstrip(".").rstrip()
    eq = _TRAILING_EQ.search(stripped)
    if eq is not None and eq[1].strip() and (best is None or eq.start() > best[0]):
        best = (eq.start(), eq[1].strip())
    return None if best is None else best[1]


def _next_line(text: str, pos: int) -> str:
    rest = text[pos:].lstrip("\n").split("\n", 1)
    return rest[0].strip() if rest else ""


def _last_number(span: str) -> tuple[int, int] | None:
    """(start, end) of the last number token in `span`: sign, digits, decimal part, "/denominator"."""
    last = None
    for m in _NUMBER.finditer(span):
        if last is not None and m.start() < last[1]:
            continue
        start, end = m.start(), m.end()
        frac = re.match(r"\.\d+", span[end:])
        if frac:
            end += frac.end()
        den = re.match(r"/(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)", span[end:])
        if den and not frac:
            end += den.end()
        if start > 0 and span[start - 1] == "-" and not _binary_context(span[:start - 1]):
            start -= 1
        last = (start, end)
    return last


def _binary_context(before: str) -> bool:
    """Whether a "-" after `before` is a binary minus (it follows a digit, letter or closing bracket)."""
    before = before.rstrip()
    return bool(before) and (before[-1].isalnum() or before[-1] in ")]}")


def _last_value(span: str) -> Value | None:
    found = _last_number(span)
    if found is None:
        return None
    start, end = found
    if _is_operand(span[:start]):
        return None
    token = span[start:end].replace(",", "")
    num, _, den = token.partition("/")
    if den and (int(den) < 2 or gcd(int(num), int(den)) != 1):
        return None  # an unevaluated division, not a final answer
    return Value(Fraction(num) / (Fraction(den) if den else 1), decimal="." in num)


def _is_operand(before: str) -> bool:
    before = before.rstrip().rstrip("([{").rstrip()
    return before.endswith(_OPERATORS)
