"""Shell words as the shell passes them: `VAR=value` assignments, `export`, `${VAR:-default}`,
`${VAR:=default}`, `$((A * B))` and word splitting of unquoted expansions. Every character of
an expanded word remembers where it was written, so `--batch_size $BATCH` points at the `8` of
`BATCH=8` and `${NGPUS:-4}` at its `4`; `$(nvidia-smi ...)` and positional arguments are
unknown until the script runs, and say so.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

from llmmem.extract.shell.lexer import (
    ArithmeticPart,
    LineIndex,
    LiteralPart,
    ParameterPart,
    RawCommand,
    RawWord,
    WordPart,
)


@dataclass(frozen=True)
class Piece:
    """A run of an expanded word's characters and where they were written."""

    text: str
    start: int
    end: int
    verbatim: bool  # text[i] was written at start + i
    splittable: bool = False  # from an unquoted expansion: blanks in it separate words


@dataclass(frozen=True)
class ShellWord:
    """A word after expansion, with the file offsets of the text it was made from."""

    text: str
    pieces: tuple[Piece, ...]
    start: int  # where the word is written (for `$BATCH`: the `$BATCH`)
    end: int
    unknown: tuple[str, ...] = ()  # expansions known only at run time, e.g. "$(nproc)"

    @property
    def is_known(self) -> bool:
        return not self.unknown

    def span(self, begin: int = 0, finish: int | None = None) -> tuple[int, int]:
        """File offsets of `text[begin:finish]`: the exact characters when they were written as
        they read, the whole variable value or default they came from, or the word itself."""
        finish = len(self.text) if finish is None else finish
        covered: list[tuple[Piece, int]] = []
        offset = 0
        for piece in self.pieces:
            piece_end = offset + len(piece.text)
            if piece_end > begin and offset < finish:
                covered.append((piece, offset))
            offset = piece_end
        if not covered:
            return self.start, self.end
        first, first_offset = covered[0]
        last, last_offset = covered[-1]
        start = first.start + (begin - first_offset) if first.verbatim else first.start
        end = last.start + (finish - last_offset) if last.verbatim else last.end
        if start > end or any(
            later.start < earlier.end
            for (earlier, _), (later, _) in zip(covered, covered[1:], strict=False)
        ):
            return self.start, self.end
        return start, end


Variables = dict[str, ShellWord]


@dataclass
class ExpandedCommand:
    words: list[ShellWord]
    environment: dict[str, ShellWord]  # `VAR=value command ...`: for this command only
    raw: RawCommand
    working_directory: str  # relative to the shell file's folder, after `cd`
    variables: dict[str, ShellWord] = field(default_factory=dict)  # set before this command


ASSIGNMENT_PATTERN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
DECLARATION_COMMANDS = frozenset({"export", "declare", "local", "readonly", "typeset"})

# `A="$A$A"` doubles a value a line: forty lines would be a terabyte. A value past these sizes
# is unknown, and the pieces copied out of variables in one file are counted, so reading stays
# in proportion to the file.
MAX_VALUE_CHARS = 100_000
MAX_VALUE_PIECES = 10_000
MAX_COPIED_PIECES = 1_000_000
MAX_UNKNOWN_KEPT = 4  # expansions known only at run time a word remembers
# `$((...))` is 64-bit signed arithmetic in the shell; a result past it is not read
SHELL_INTEGER_BOUND = 2**63


class ShellExpander:
    """Runs the assignments of a script in order and expands each command's words."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.variables: Variables = {}
        self.working_directory = "."
        self.problems: list[str] = []
        self.copied_pieces = 0  # pieces copied out of variables so far (MAX_COPIED_PIECES)

    @cached_property
    def lines(self) -> LineIndex:
        return LineIndex(self.text)

    def expanded_commands(self, commands: list[RawCommand]) -> Iterator[ExpandedCommand]:
        for command in commands:
            environment: dict[str, ShellWord] = {}
            index = 0
            while index < len(command.words) and _assignment_name(command.words[index]):
                name, value = self.assignment(command.words[index])
                environment[name] = value
                index += 1
            rest = command.words[index:]
            if not rest:
                self.variables.update(environment)
                continue
            first = self.expand_word(rest[0])
            if first and first[0].text in DECLARATION_COMMANDS:
                for raw in rest[1:]:
                    if _assignment_name(raw):
                        name, value = self.assignment(raw)
                        self.variables[name] = value
                continue
            words = [word for raw in rest for word in self.expand_word(raw)]
            if words and words[0].text == "cd":
                self.change_directory(words[1:])
            yield ExpandedCommand(
                words, environment, command, self.working_directory, dict(self.variables)
            )

    def change_directory(self, arguments: list[ShellWord]) -> None:
        import posixpath

        if not arguments or not arguments[0].is_known:
            return  # `cd "$(dirname "$0")"`: the script's own folder, where we already are
        target = arguments[0].text
        if target.startswith(("/", "~")):
            return  # outside what we can read relative to the file
        self.working_directory = posixpath.normpath(posixpath.join(self.working_directory, target))

    def assignment(self, raw: RawWord) -> tuple[str, ShellWord]:
        first = raw.parts[0]
        assert isinstance(first, LiteralPart)
        match = ASSIGNMENT_PATTERN.match(first.text)
        assert match is not None
        name, append = match.group(1), match.group(2)
        value_start = first.start + match.end()
        rest_of_first = LiteralPart(first.text[match.end() :], value_start, first.end, True, False)
        value_parts = (rest_of_first, *raw.parts[1:]) if rest_of_first.text else raw.parts[1:]
        pieces, unknown = self.expand_parts(value_parts, quoted_context=True)
        if append and name in self.variables:
            pieces = (*self.variables[name].pieces, *pieces)
            unknown = kept_unknown([*self.variables[name].unknown, *unknown])
        value = ShellWord(
            "".join(piece.text for piece in pieces), pieces, value_start, raw.end, unknown
        )
        return name, self.bounded(name, value)

    def bounded(self, name: str, value: ShellWord) -> ShellWord:
        """`value`, or an unknown value with a problem line where it is past the sizes a
        variable may have."""
        if len(value.text) <= MAX_VALUE_CHARS and len(value.pieces) <= MAX_VALUE_PIECES:
            return value
        self.problems.append(
            f"{self.lines.describe(value.start)}: ${name} grows past {MAX_VALUE_CHARS} "
            f"characters or {MAX_VALUE_PIECES} joined parts; read as known only when the "
            "script runs"
        )
        return ShellWord("", (), value.start, value.end, (f"${name}",))

    def expand_word(self, raw: RawWord) -> list[ShellWord]:
        pieces, unknown = self.expand_parts(raw.parts, quoted_context=False)
        return list(_split_fields(pieces, raw, unknown))

    def expand_parts(
        self, parts: tuple[WordPart, ...], *, quoted_context: bool
    ) -> tuple[tuple[Piece, ...], tuple[str, ...]]:
        pieces: list[Piece] = []
        unknown: list[str] = []
        for part in parts:
            splittable = not (quoted_context or part.quoted)
            if isinstance(part, LiteralPart):
                pieces.append(Piece(part.text, part.start, part.end, part.verbatim))
            elif isinstance(part, ParameterPart):
                pieces.extend(self.parameter(part, unknown, quoted_context or part.quoted))
            elif isinstance(part, ArithmeticPart):
                result = self.arithmetic(part.expression)
                if result is None:
                    unknown.append(self.text[part.start : part.end])
                else:
                    pieces.append(Piece(str(result), part.start, part.end, False, splittable))
            else:
                unknown.append(part.text)
        return tuple(pieces), kept_unknown(unknown)

    def parameter(self, part: ParameterPart, unknown: list[str], quoted: bool) -> tuple[Piece, ...]:
        """The pieces `part` expands to: the variable's value (split like any unquoted
        expansion) or the operator's argument (split as it is quoted inside the braces)."""
        variable = self.variables.get(part.name)
        if variable is not None and not self.may_copy(variable, part):
            unknown.append(self.text[part.start : part.end])
            return ()
        value = tuple(_respan(variable.pieces, not quoted)) if variable is not None else None
        is_set = variable is not None
        is_non_empty = variable is not None and (bool(variable.text) or bool(variable.unknown))
        if variable is not None and variable.unknown and (is_non_empty or not part.operator):
            unknown.extend(variable.unknown)
        operator_text = part.operator
        if operator_text == "":
            if value is None:
                unknown.append(self.text[part.start : part.end])
                return ()
            return value
        uses_value = is_non_empty if operator_text.startswith(":") else is_set
        kind = operator_text.lstrip(":")
        if kind in ("-", "="):
            if uses_value and value is not None:
                return value
            argument, argument_unknown = self.expand_parts(part.argument, quoted_context=quoted)
            unknown.extend(argument_unknown)
            if kind == "=":
                argument_text = "".join(piece.text for piece in argument)
                self.variables[part.name] = self.bounded(
                    part.name,
                    ShellWord(
                        argument_text, argument, part.start, part.end, tuple(argument_unknown)
                    ),
                )
            return argument
        if kind == "+":
            if not uses_value:
                return ()
            argument, argument_unknown = self.expand_parts(part.argument, quoted_context=quoted)
            unknown.extend(argument_unknown)
            return argument
        if uses_value and value is not None:  # "?"
            return value
        unknown.append(self.text[part.start : part.end])
        return ()

    def may_copy(self, variable: ShellWord, part: ParameterPart) -> bool:
        """Whether the file's budget of copied pieces still holds `variable`'s; the first time
        it does not, a problem line says so."""
        if self.copied_pieces > MAX_COPIED_PIECES:
            return False
        self.copied_pieces += len(variable.pieces)
        if self.copied_pieces <= MAX_COPIED_PIECES:
            return True
        self.problems.append(
            f"{self.lines.describe(part.start)}: the script expands its variables past "
            f"{MAX_COPIED_PIECES} pieces; this expansion and the later ones are read as known "
            "only when the script runs"
        )
        return False

    def arithmetic(self, expression: str) -> int | None:
        missing: list[str] = []

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2) or match.group(3)
            variable = self.variables.get(name)
            if variable is None or variable.unknown:
                missing.append(name)
                return "0"
            return variable.text

        python_text = re.sub(
            r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)|\b([A-Za-z_][A-Za-z0-9_]*)\b",
            substitute,
            expression,
        )
        if missing:
            return None
        return evaluate_integer_expression(python_text)


def kept_unknown(expansions: list[str]) -> tuple[str, ...]:
    """The first few distinct expansions known only at run time (the first is the one a
    problem line names): `A="$A$A"` on an unknown `$A` must not double a list a line."""
    return tuple(dict.fromkeys(expansions))[:MAX_UNKNOWN_KEPT]


def _assignment_name(raw: RawWord) -> str | None:
    if not raw.parts:
        return None
    first = raw.parts[0]
    if not isinstance(first, LiteralPart) or first.quoted or not first.verbatim:
        return None
    match = ASSIGNMENT_PATTERN.match(first.text)
    return match.group(1) if match else None


def _respan(pieces: tuple[Piece, ...], splittable: bool) -> Iterator[Piece]:
    for piece in pieces:
        yield Piece(piece.text, piece.start, piece.end, piece.verbatim, splittable)


def _split_fields(
    pieces: tuple[Piece, ...], raw: RawWord, unknown: tuple[str, ...]
) -> Iterator[ShellWord]:
    """Word splitting: blanks inside unquoted expansions separate words; an unquoted expansion
    that is empty leaves no word at all."""
    fields: list[list[Piece]] = [[]]
    for piece in pieces:
        if not piece.splittable:
            fields[-1].append(piece)
            continue
        offset = 0
        for chunk in re.split(r"([ \t\n]+)", piece.text):
            if chunk and chunk.strip(" \t\n") == "":
                fields.append([])
            elif chunk:
                if piece.verbatim:
                    start = piece.start + offset
                    fields[-1].append(Piece(chunk, start, start + len(chunk), True, True))
                else:
                    fields[-1].append(Piece(chunk, piece.start, piece.end, False, True))
            offset += len(chunk)
    kept = [field_pieces for field_pieces in fields if field_pieces]
    if not kept:
        if not unknown and not any(part.quoted for part in raw.parts):
            return  # `$EMPTY` unquoted: no word at all
        kept = [[]]  # `""`, or an expansion only known at run time: one word, kept visible
    for field_pieces in kept:
        text = "".join(piece.text for piece in field_pieces)
        yield ShellWord(text, tuple(field_pieces), raw.start, raw.end, unknown)
        unknown = ()  # reported once, on the first word of a split


ARITHMETIC_OPERATORS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Mod: lambda left, right: left - right * _truncating_division(left, right),
    ast.FloorDiv: lambda left, right: _truncating_division(left, right),
    ast.Div: lambda left, right: _truncating_division(left, right),
    ast.Pow: operator.pow,
}


def _truncating_division(left: int, right: int) -> int:
    """Shell (C) integer division: rounds toward zero, unlike Python's `//`."""
    quotient = abs(left) // abs(right)
    return quotient if (left < 0) == (right < 0) else -quotient


def evaluate_integer_expression(expression: str) -> int | None:
    """`$((...))` over integers: + - * / % ** and parentheses; None for anything else."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
            return value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC_OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and not 0 <= right <= 64:
                raise ValueError("exponent out of range")
            result = ARITHMETIC_OPERATORS[type(node.op)](left, right)
            if not -SHELL_INTEGER_BOUND <= result < SHELL_INTEGER_BOUND:
                raise ValueError("past the shell's 64-bit integers")
            return result
        raise ValueError("not integer arithmetic")

    try:
        result = value(tree.body)
    except (ValueError, ZeroDivisionError, RecursionError, OverflowError):
        return None
    return result if -SHELL_INTEGER_BOUND <= result < SHELL_INTEGER_BOUND else None
