"""Shell words as written: a scanner following POSIX shell quoting (what `shlex` does in posix
mode) that also keeps each word's offsets in the file; `shlex` splits the same way but cannot
say where a word came from, and the editor needs that across backslash continuations.

Commands are split at newlines and `; & | ( )`; redirections are set aside (`> file` targets are
kept, for `cat > ds.json <<EOF`), here-document bodies are skipped and remembered, and every
`$NAME`, `${NAME<operator>argument}`, `$((...))`, `$(...)` and backquoted part of a word keeps
where it was written.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class LiteralPart:
    text: str
    start: int
    end: int
    verbatim: bool  # text[i] is the character at offset start + i (no quote or escape inside)
    quoted: bool


@dataclass(frozen=True)
class ParameterPart:
    """`$NAME`, `${NAME}`, `${NAME:-argument}` and the other `${NAME<operator>argument}` forms."""

    name: str
    operator: str  # "" or one of ":-", "-", ":=", "=", ":+", "+", ":?", "?"
    argument: tuple[WordPart, ...]
    start: int
    end: int
    quoted: bool


@dataclass(frozen=True)
class SubstitutionPart:
    """`$(command)`, a backquoted command or an unsupported `${...}` form: known at run time."""

    text: str
    start: int
    end: int
    quoted: bool


@dataclass(frozen=True)
class ArithmeticPart:
    expression: str
    start: int
    end: int
    quoted: bool


WordPart = LiteralPart | ParameterPart | SubstitutionPart | ArithmeticPart


@dataclass(frozen=True)
class RawWord:
    parts: tuple[WordPart, ...]
    start: int
    end: int


@dataclass(frozen=True)
class HereDocument:
    """A `<<EOF` body: its text and where it lies in the file."""

    delimiter: str
    start: int
    end: int


@dataclass
class RawCommand:
    words: list[RawWord] = field(default_factory=list)
    output_targets: list[RawWord] = field(default_factory=list)  # `> file`, `>> file`
    here_documents: list[HereDocument] = field(default_factory=list)


WORD_BREAKS = frozenset(" \t\r\n;&|()<>")
DOUBLE_QUOTE_ESCAPES = frozenset('$`"\\\n')
PARAMETER_OPERATORS = (":-", ":=", ":+", ":?", "-", "=", "+", "?")
SPECIAL_PARAMETERS = frozenset("@*#?$!-0123456789")
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `${A:-${B:-...}}`: each level is scanned to its closing brace, so the depth read is bounded
MAX_PARAMETER_NESTING = 8


class ShellScanner:
    """Splits shell text into commands of words, keeping the offsets of every part."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.problems: list[str] = []
        self.pending_here_documents: deque[tuple[str, bool, RawCommand]] = deque()
        self.parameter_depth = 0  # `${NAME<operator>...}` arguments being read

    @cached_property
    def lines(self) -> LineIndex:
        return LineIndex(self.text)

    def commands(self) -> list[RawCommand]:
        text = self.text
        commands: list[RawCommand] = []
        current = RawCommand()
        position = 0
        while position < len(text):
            character = text[position]
            if character in " \t\r":
                position += 1
            elif text.startswith("\\\n", position) or text.startswith("\\\r\n", position):
                position += 2 if text[position + 1] == "\n" else 3
            elif character == "\n":
                commands.append(current)
                current = RawCommand()
                position = self.skip_here_documents(position + 1)
            elif character == "#":
                newline = text.find("\n", position)
                position = len(text) if newline < 0 else newline
            elif text.startswith("&>", position) or character in "<>":
                position = self.redirection(position, current)
            elif character in ";&|()":
                commands.append(current)
                current = RawCommand()
                position += 1
            else:
                word = self.word(position)
                following = text[word.end : word.end + 1]
                if following in ("<", ">") and _is_file_descriptor(word):
                    position = word.end  # `2>&1`: the 2 belongs to the redirection
                    continue
                if following == "(" and _array_name(word):
                    word = self.array_assignment(word)
                current.words.append(word)
                position = max(word.end, position + 1)
        commands.append(current)
        return [command for command in commands if command.words or command.here_documents]

    def array_assignment(self, name_word: RawWord) -> RawWord:
        """`ARGS=( --lr 1e-5  # comment \n --batch 8 )`: one assignment whose value is the
        elements joined by blanks, so that `${ARGS[@]}` expands to them as words."""
        text = self.text
        parts: list[WordPart] = list(name_word.parts)
        position = name_word.end + 1
        first = True
        while position < len(text):
            character = text[position]
            if character in " \t\r\n":
                position += 1
            elif text.startswith("\\\n", position):
                position += 2
            elif character == "#":
                newline = text.find("\n", position)
                position = len(text) if newline < 0 else newline
            elif character == ")":
                return RawWord(tuple(parts), name_word.start, position + 1)
            else:
                element = self.word(position)
                if not first:
                    parts.append(LiteralPart(" ", element.start, element.start, False, False))
                parts.extend(element.parts)
                first = False
                position = max(element.end, position + 1)
        self.unterminated(name_word.end, "(")
        return RawWord(tuple(parts), name_word.start, len(text))

    # -- redirections and here-documents

    def redirection(self, position: int, command: RawCommand) -> int:
        text = self.text
        for operator_text in ("<<<", "<<-", "<<", ">>", ">&", "<&", "&>", ">|", "<>", ">", "<"):
            if text.startswith(operator_text, position):
                break
        position += len(operator_text)
        while position < len(text) and text[position] in " \t":
            position += 1
        if position >= len(text) or text[position] in WORD_BREAKS:
            return position
        target = self.word(position)
        if operator_text in ("<<", "<<-"):
            delimiter = "".join(
                part.text if isinstance(part, LiteralPart) else text[part.start : part.end]
                for part in target.parts
            )
            self.pending_here_documents.append((delimiter, operator_text == "<<-", command))
        elif operator_text in (">", ">>", ">|", "&>"):
            command.output_targets.append(target)
        return max(target.end, position + 1)

    def skip_here_documents(self, position: int) -> int:
        text = self.text
        while self.pending_here_documents:
            delimiter, strip_tabs, command = self.pending_here_documents.popleft()
            body_start = position
            while position < len(text):
                newline = text.find("\n", position)
                line_end = len(text) if newline < 0 else newline
                line = text[position:line_end].rstrip("\r")
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    command.here_documents.append(HereDocument(delimiter, body_start, position))
                    position = min(len(text), line_end + 1)
                    break
                position = line_end + 1
            else:
                self.problems.append(
                    f"{self.lines.describe(body_start)}: here-document '{delimiter}' "
                    "has no closing line"
                )
                command.here_documents.append(HereDocument(delimiter, body_start, len(text)))
                position = len(text)
        return position

    # -- words

    def word(self, start: int, stop: int | None = None, blanks_break: bool = True) -> RawWord:
        """The word starting at `start`; it ends at a blank or operator (or at `stop`)."""
        text = self.text
        end_limit = len(text) if stop is None else stop
        parts: list[WordPart] = []
        run_start = start
        position = start

        def flush_run(until: int) -> None:
            if until > run_start:
                parts.append(LiteralPart(text[run_start:until], run_start, until, True, False))

        while position < end_limit:
            character = text[position]
            if blanks_break and character in WORD_BREAKS:
                break
            if character == "\\":
                flush_run(position)
                if text.startswith("\n", position + 1) or text.startswith("\r\n", position + 1):
                    position += 2 if text[position + 1] == "\n" else 3
                elif position + 1 < end_limit:
                    parts.append(
                        LiteralPart(text[position + 1], position, position + 2, False, False)
                    )
                    position += 2
                else:
                    position += 1
                run_start = position
            elif character == "'":
                flush_run(position)
                close = text.find("'", position + 1, end_limit)
                if close < 0:
                    self.unterminated(position, "'")
                    close = end_limit
                parts.append(
                    LiteralPart(text[position + 1 : close], position + 1, close, True, True)
                )
                position = run_start = min(close + 1, end_limit)
            elif character == '"':
                flush_run(position)
                position = run_start = self.double_quoted(position, end_limit, parts)
            elif character == "$" or character == "`":
                part, after = self.expansion(position, end_limit, quoted=False)
                if part is None:
                    position += 1
                    continue
                flush_run(position)
                parts.append(part)
                position = run_start = after
            else:
                position += 1
        flush_run(position)
        return RawWord(tuple(parts), start, position)

    def double_quoted(self, quote: int, end_limit: int, parts: list[WordPart]) -> int:
        text = self.text
        position = run_start = quote + 1
        while position < end_limit:
            character = text[position]
            if character == '"':
                if position > run_start or position == quote + 1:  # "" is an empty word
                    parts.append(
                        LiteralPart(text[run_start:position], run_start, position, True, True)
                    )
                return position + 1
            if character == "\\" and text[position + 1 : position + 2] in DOUBLE_QUOTE_ESCAPES:
                if position > run_start:
                    parts.append(
                        LiteralPart(text[run_start:position], run_start, position, True, True)
                    )
                if text[position + 1] != "\n":
                    parts.append(
                        LiteralPart(text[position + 1], position, position + 2, False, True)
                    )
                position = run_start = position + 2
            elif character in "$`":
                part, after = self.expansion(position, end_limit, quoted=True)
                if part is None:
                    position += 1
                    continue
                if position > run_start:
                    parts.append(
                        LiteralPart(text[run_start:position], run_start, position, True, True)
                    )
                parts.append(part)
                position = run_start = after
            else:
                position += 1
        self.unterminated(quote, '"')
        if end_limit > run_start:
            parts.append(LiteralPart(text[run_start:end_limit], run_start, end_limit, True, True))
        return end_limit

    def expansion(
        self, position: int, end_limit: int, *, quoted: bool
    ) -> tuple[WordPart | None, int]:
        """The `$...` or backquoted expansion at `position`, and the offset after it."""
        text = self.text
        if text[position] == "`":
            close = position + 1
            while close < end_limit and text[close] != "`":
                close += 2 if text[close] == "\\" else 1
            if close >= end_limit:
                self.unterminated(position, "`")
                close = end_limit
            after = min(close + 1, end_limit)
            return SubstitutionPart(text[position:after], position, after, quoted), after
        following = text[position + 1 : position + 2]
        if text.startswith("$((", position):
            close = self.closing(position + 1, end_limit, "(", ")")
            after = min(close + 1, end_limit)
            inner_end = max(position + 3, close - 1)
            expression = text[position + 3 : inner_end]
            return ArithmeticPart(expression, position, after, quoted), after
        if following == "(":
            close = self.closing(position + 1, end_limit, "(", ")")
            after = min(close + 1, end_limit)
            return SubstitutionPart(text[position:after], position, after, quoted), after
        if following == "{":
            return self.braced_parameter(position, end_limit, quoted)
        if following == "'" and not quoted:
            close = text.find("'", position + 2, end_limit)
            close = end_limit if close < 0 else close
            literal = LiteralPart(text[position + 2 : close], position + 2, close, True, True)
            return literal, min(close + 1, end_limit)
        if following and following in SPECIAL_PARAMETERS:
            return ParameterPart(following, "", (), position, position + 2, quoted), position + 2
        name = NAME_PATTERN.match(text, position + 1, end_limit)
        if name is None:
            return None, position + 1
        return ParameterPart(name.group(), "", (), position, name.end(), quoted), name.end()

    def braced_parameter(self, position: int, end_limit: int, quoted: bool) -> tuple[WordPart, int]:
        text = self.text
        close = self.closing(position + 1, end_limit, "{", "}")
        after = min(close + 1, end_limit)
        inner_start = position + 2
        name_match = NAME_PATTERN.match(text, inner_start, close)
        if name_match is None:
            special = text[inner_start : inner_start + 1]
            if special and special in SPECIAL_PARAMETERS and inner_start + 1 == close:
                return ParameterPart(special, "", (), position, after, quoted), after
            return SubstitutionPart(text[position:after], position, after, quoted), after
        rest = name_match.end()
        if rest == close:
            return ParameterPart(name_match.group(), "", (), position, after, quoted), after
        if text[rest:close] in ("[@]", "[*]"):
            # every element of an array, as separate words even inside quotes
            return ParameterPart(name_match.group(), "", (), position, after, False), after
        for operator_text in PARAMETER_OPERATORS:
            if text.startswith(operator_text, rest):
                if self.parameter_depth >= MAX_PARAMETER_NESTING:
                    self.problems.append(
                        f"{self.lines.describe(position)}: ${{...}} nests more than "
                        f"{MAX_PARAMETER_NESTING} deep; read as known only when the script runs"
                    )
                    return SubstitutionPart(text[position:after], position, after, quoted), after
                argument_start = rest + len(operator_text)
                self.parameter_depth += 1
                try:
                    argument = self.word(argument_start, stop=close, blanks_break=False)
                finally:
                    self.parameter_depth -= 1
                part = ParameterPart(
                    name_match.group(), operator_text, argument.parts, position, after, quoted
                )
                return part, after
        return SubstitutionPart(text[position:after], position, after, quoted), after

    def closing(self, opening: int, end_limit: int, open_text: str, close_text: str) -> int:
        """The offset of the bracket closing the one at `opening`, skipping quoted text."""
        text = self.text
        depth = 0
        position = opening
        while position < end_limit:
            character = text[position]
            if character == "\\":
                position += 2
                continue
            if character == "'" and open_text == "(":
                close = text.find("'", position + 1, end_limit)
                position = end_limit if close < 0 else close + 1
                continue
            if character == open_text:
                depth += 1
            elif character == close_text:
                depth -= 1
                if depth == 0:
                    return position
            position += 1
        self.unterminated(opening, open_text)
        return end_limit

    def unterminated(self, position: int, opening: str) -> None:
        self.problems.append(
            f"{self.lines.describe(position)}: {opening} is never closed; "
            "read to the end of the file"
        )


def _is_file_descriptor(word: RawWord) -> bool:
    return (
        len(word.parts) == 1
        and isinstance(word.parts[0], LiteralPart)
        and word.parts[0].verbatim
        and not word.parts[0].quoted
        and word.parts[0].text.isdigit()
    )


class LineIndex:
    """Lines and columns of one text's offsets: the line starts are found once, then each
    offset is a bisection (a launcher with thousands of flags asks for thousands of ranges)."""

    def __init__(self, text: str) -> None:
        self.length = len(text)
        self.line_starts = [0, *(match.end() for match in re.finditer("\n", text))]

    def position(self, offset: int) -> tuple[int, int]:
        """0-based line and column of `offset` (clamped to the text)."""
        offset = max(0, min(offset, self.length))
        line = bisect_right(self.line_starts, offset) - 1
        return line, offset - self.line_starts[line]

    def describe(self, offset: int) -> str:
        line, column = self.position(offset)
        return f"line {line + 1}, column {column + 1}"


def describe_offset(text: str, offset: int) -> str:
    line, column = offset_to_position(text, offset)
    return f"line {line + 1}, column {column + 1}"


def offset_to_position(text: str, offset: int) -> tuple[int, int]:
    """One offset's line and column (for many offsets of one text, use a LineIndex)."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset)
    line_start = text.rfind("\n", 0, offset) + 1
    return line, offset - line_start


def _array_name(word: RawWord) -> bool:
    """`NAME=` with nothing after the `=`, written before a `(`: an array assignment."""
    if len(word.parts) != 1 or not isinstance(word.parts[0], LiteralPart):
        return False
    literal = word.parts[0]
    return (
        not literal.quoted
        and NAME_PATTERN.fullmatch(literal.text[:-1]) is not None
        and (literal.text.endswith("="))
    )
