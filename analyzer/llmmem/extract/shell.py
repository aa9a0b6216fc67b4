"""Shell launchers: the command line that starts training, read into a TrainingPlan.

    NGPUS=${NGPUS:-4}
    torchrun --nproc_per_node $NGPUS train.py \\
        --per_device_train_batch_size 8 --bf16

The script is read in three layers:
1. words as written: a scanner following POSIX shell quoting (what `shlex` does in posix mode)
   that also keeps each word's offsets in the file; `shlex` splits the same way but cannot say
   where a word came from, and the editor needs that across backslash continuations;
2. words as the shell would pass them: `VAR=value` assignments, `export`, `${VAR:-default}`,
   `${VAR:=default}`, `$((A * B))` and word splitting of unquoted expansions; every character of
   an expanded word remembers where it was written, so `--batch_size $BATCH` points at the `8` of
   `BATCH=8` and `${NGPUS:-4}` at its `4`; `$(nvidia-smi ...)` and positional arguments are
   unknown until the script runs, and say so;
3. launchers: python, torchrun, `python -m torch.distributed.run`, accelerate launch, deepspeed,
   llamafactory-cli, tune run, trl, axolotl, litgpt. Their own options give the world size; the
   training script or config they start is read when it lies beside the shell file (or where the
   path points, relative to it), and the flags after it override what that file says.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

import yaml

from llmmem.extract.builder import PlanBuilder
from llmmem.extract.configs import (
    FRAMEWORK_CONFIG_CLASSES,
    FSDP_STRATEGY_NAMES,
    LITGPT_LORA_DEFAULTS,
    ConfigReading,
    Override,
    Setting,
    apply_file_pragmas,
    display_path,
    plan_from_problems,
    read_config,
    read_text_file,
    resolve_reference,
    torchtune_model,
)
from llmmem.extract.pragmas import ProjectSettings, apply_project_settings
from llmmem.plan import Provenance, Sourced, SourceRange, TrainingPlan

# --------------------------------------------------------------------------------------------
# 1. words as written


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


class ShellScanner:
    """Splits shell text into commands of words, keeping the offsets of every part."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.problems: list[str] = []
        self.pending_here_documents: list[tuple[str, bool, RawCommand]] = []

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
                current.words.append(word)
                position = max(word.end, position + 1)
        commands.append(current)
        return [command for command in commands if command.words or command.here_documents]

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
            delimiter, strip_tabs, command = self.pending_here_documents.pop(0)
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
                    f"{describe_offset(text, body_start)}: here-document '{delimiter}' "
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
        for operator_text in PARAMETER_OPERATORS:
            if text.startswith(operator_text, rest):
                argument_start = rest + len(operator_text)
                argument = self.word(argument_start, stop=close, blanks_break=False)
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
            f"{describe_offset(self.text, position)}: {opening} is never closed; "
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


def describe_offset(text: str, offset: int) -> str:
    line, column = offset_to_position(text, offset)
    return f"line {line + 1}, column {column + 1}"


def offset_to_position(text: str, offset: int) -> tuple[int, int]:
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset)
    line_start = text.rfind("\n", 0, offset) + 1
    return line, offset - line_start


# --------------------------------------------------------------------------------------------
# 2. words as the shell passes them


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


class ShellExpander:
    """Runs the assignments of a script in order and expands each command's words."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.variables: Variables = {}
        self.working_directory = "."

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
            unknown = (*self.variables[name].unknown, *unknown)
        value = ShellWord(
            "".join(piece.text for piece in pieces), pieces, value_start, raw.end, unknown
        )
        return name, value

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
        return tuple(pieces), tuple(unknown)

    def parameter(self, part: ParameterPart, unknown: list[str], quoted: bool) -> tuple[Piece, ...]:
        """The pieces `part` expands to: the variable's value (split like any unquoted
        expansion) or the operator's argument (split as it is quoted inside the braces)."""
        variable = self.variables.get(part.name)
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
                self.variables[part.name] = ShellWord(
                    argument_text, argument, part.start, part.end, tuple(argument_unknown)
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
            return ARITHMETIC_OPERATORS[type(node.op)](left, right)
        raise ValueError("not integer arithmetic")

    try:
        return value(tree.body)
    except (ValueError, ZeroDivisionError, RecursionError, OverflowError):
        return None


# --------------------------------------------------------------------------------------------
# 3. launchers


@dataclass(frozen=True)
class WordSlice:
    """A word, or the part of it after `=` in `--name=value`."""

    word: ShellWord
    begin: int = 0

    @property
    def text(self) -> str:
        return self.word.text[self.begin :]

    @property
    def is_known(self) -> bool:
        return self.word.is_known

    def offsets(self) -> tuple[int, int]:
        return self.word.span(self.begin)


@dataclass(frozen=True)
class CommandOption:
    """`--name value`, `--name=value` or a bare `--name`, as a launcher or a program reads it."""

    name: str  # dashes stripped, `-` inside read as `_`: "nproc_per_node", "train.epochs"
    flag: ShellWord
    values: tuple[WordSlice, ...] = ()  # empty: a bare flag

    @property
    def value(self) -> WordSlice | None:
        return self.values[0] if self.values else None


@dataclass
class Launch:
    """One command that starts training, taken apart."""

    launcher: str  # python, torchrun, accelerate, deepspeed, llamafactory, tune, trl, axolotl,
    # litgpt
    command: ExpandedCommand
    options: dict[str, CommandOption] = field(default_factory=dict)  # the launcher's own
    target: ShellWord | None = None  # the script, module, config or recipe it starts
    target_kind: str = "none"  # "script", "module", "config", "none"
    subcommand: str | None = None  # trl sft, llamafactory-cli train, litgpt finetune_lora
    arguments: list[ShellWord] = field(default_factory=list)  # what the program receives
    scheduler_options: dict[str, CommandOption] = field(default_factory=dict)  # srun, mpirun
    outer_launcher: str | None = None  # `accelerate launch -m axolotl.cli.train`: accelerate

    def uses(self, *launchers: str) -> bool:
        """Started by one of `launchers`, directly or through another launcher."""
        return self.launcher in launchers or self.outer_launcher in launchers

    @property
    def priority(self) -> int:
        """Launchers made for training come before a plain `python x.py`."""
        if self.launcher != "python":
            return 2
        name = self.target.text.lower() if self.target is not None else ""
        return 1 if any(word in name for word in ("train", "finetune", "sft", "tune")) else 0


PYTHON_NAME = re.compile(r"^python[0-9.]*$")
SCHEDULERS = frozenset({"srun", "mpirun", "mpiexec"})
LAUNCH_PROGRAMS = frozenset(
    {
        "torchrun",
        "accelerate",
        "deepspeed",
        "llamafactory-cli",
        "lmf",
        "tune",
        "trl",
        "axolotl",
        "litgpt",
    }
)
WRAPPERS = frozenset({"nohup", "exec", "time", "command", "builtin", "stdbuf", "nice", "sudo"})
PYTHON_BOOLEAN_OPTIONS = frozenset("bBdEiIOqsSuvx")
TORCHRUN_BOOLEANS = frozenset(
    {"standalone", "no_python", "module", "m", "run_path", "virtual_local_rank"}
)
ACCELERATE_BOOLEANS = frozenset(
    {
        "multi_gpu",
        "use_deepspeed",
        "use_fsdp",
        "use_megatron_lm",
        "use_xpu",
        "cpu",
        "tpu",
        "debug",
        "quiet",
        "q",
        "module",
        "m",
        "no_python",
        "same_network",
        "enable_cpu_affinity",
        "dynamo_use_fullgraph",
        "dynamo_use_dynamic",
        "ipex",
    }
)
DEEPSPEED_BOOLEANS = frozenset(
    {
        "no_python",
        "module",
        "no_local_rank",
        "no_ssh_check",
        "autotuning",
        "force_multi",
        "save_pid",
        "enable_each_rank_log",
        "bind_cores_to_rank",
        "elastic_training",
        "no_ssh",
    }
)
TRL_COMMANDS = {
    "sft": "SFTConfig",
    "dpo": "DPOConfig",
    "grpo": "GRPOConfig",
    "kto": "KTOConfig",
    "reward": "RewardConfig",
    "orpo": "ORPOConfig",
}
LITGPT_COMMANDS = frozenset(
    {
        "finetune",
        "finetune_lora",
        "finetune_full",
        "finetune_adapter",
        "finetune_adapter_v2",
        "pretrain",
    }
)
KNOWN_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "accelerate.commands.launch": "accelerate",
    "deepspeed.launcher.runner": "deepspeed",
    "axolotl.cli.train": "axolotl",
    "llamafactory.launcher": "llamafactory",
}
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
LIST_FLAGS = frozenset(
    {
        "lora_target_modules",
        "lora_modules_to_save",
        "target_modules",
        "modules_to_save",
        "lora_target",
    }
)


def option_name(text: str) -> str:
    return text.lstrip("-").replace("-", "_")


def read_options(
    words: list[ShellWord],
    start: int,
    *,
    booleans: frozenset[str],
    list_flags: frozenset[str] = frozenset(),
) -> tuple[dict[str, CommandOption], int]:
    """Options from `words[start:]` up to the first positional word; returns them and the index
    of that word. A flag not known to be boolean takes the next word as its value unless that
    word is another option or looks like the script or config being launched."""
    options: dict[str, CommandOption] = {}
    index = start
    while index < len(words):
        word = words[index]
        text = word.text
        if text == "--":
            return options, index + 1
        if not text.startswith("-") or text == "-" or _is_number(text):
            break
        if "=" in text:
            name = option_name(text.split("=", 1)[0])
            options[name] = CommandOption(name, word, (WordSlice(word, text.index("=") + 1),))
            index += 1
            continue
        name = option_name(text)
        index += 1
        if name in booleans:
            options[name] = CommandOption(name, word)
            continue
        values: list[WordSlice] = []
        while index < len(words) and _takes_as_value(words[index]):
            values.append(WordSlice(words[index]))
            index += 1
            if name not in list_flags:
                break
        options[name] = CommandOption(name, word, tuple(values))
    return options, index


def program_options(words: list[ShellWord]) -> dict[str, CommandOption]:
    """Every `--name value` among a program's arguments; positional words are skipped."""
    options: dict[str, CommandOption] = {}
    index = 0
    while index < len(words):
        found, after = read_options(words, index, booleans=frozenset(), list_flags=LIST_FLAGS)
        options.update(found)
        index = after if after > index else index + 1
    return options


def _is_number(text: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(\.\d*)?([eE]-?\d+)?", text))


def _takes_as_value(word: ShellWord) -> bool:
    text = word.text
    if text.startswith("-") and not _is_number(text) and text != "-":
        return False
    return not text.endswith(".py")


def interpret_command(command: ExpandedCommand) -> Launch | None:
    """The launch a command makes, or None when it starts no training."""
    words = command.words
    index = 0
    while index < len(words) and (
        _basename(words[index].text) in WRAPPERS
        or words[index].text.startswith("-")
        and index > 0
        and _basename(words[index - 1].text) in WRAPPERS
    ):
        index += 1
    if index < len(words) and _basename(words[index].text) == "env":
        index += 1
        while index < len(words) and (
            "=" in words[index].text or words[index].text.startswith("-")
        ):
            index += 1
    if index >= len(words):
        return None
    program = _basename(words[index].text)
    rest = index + 1
    if PYTHON_NAME.match(program):
        return interpret_python(command, rest)
    if program == "torchrun":
        return interpret_torchrun(command, rest, "torchrun")
    if program == "accelerate" and rest < len(words) and words[rest].text == "launch":
        return interpret_accelerate(command, rest + 1)
    if program == "deepspeed":
        return interpret_deepspeed(command, rest)
    if program in ("llamafactory-cli", "lmf"):
        return interpret_llamafactory(command, rest)
    if program == "tune" and rest < len(words) and words[rest].text == "run":
        return interpret_tune(command, rest + 1)
    if program == "trl" and rest < len(words) and words[rest].text in TRL_COMMANDS:
        launch = Launch("trl", command, subcommand=words[rest].text)
        return with_config_option(launch, words[rest + 1 :])
    if program == "axolotl" and rest < len(words) and words[rest].text == "train":
        return with_positional_config(
            Launch("axolotl", command, subcommand="train"), words[rest + 1 :]
        )
    if program == "litgpt" and rest < len(words) and words[rest].text in LITGPT_COMMANDS:
        return interpret_litgpt(command, rest)
    if program in SCHEDULERS:
        return interpret_scheduler(command, rest)
    return None


def interpret_scheduler(command: ExpandedCommand, start: int) -> Launch | None:
    """`srun -N 2 --ntasks-per-node 8 python train.py`, `mpirun -np 4 python train.py`: the
    scheduler's options, then the command it runs on every task."""
    words = command.words
    index = start
    while index < len(words):
        program = _basename(words[index].text)
        if PYTHON_NAME.match(program) or program in LAUNCH_PROGRAMS:
            break
        index += 1
    else:
        return None
    options, _ = read_options(words[:index], start, booleans=frozenset())
    inner = interpret_command(
        ExpandedCommand(
            words[index:],
            command.environment,
            command.raw,
            command.working_directory,
            command.variables,
        )
    )
    if inner is not None:
        inner.scheduler_options = options
    return inner


def _basename(text: str) -> str:
    return text.rsplit("/", 1)[-1]


def interpret_python(command: ExpandedCommand, start: int) -> Launch | None:
    words = command.words
    index = start
    while index < len(words):
        text = words[index].text
        if text == "-m" and index + 1 < len(words):
            return interpret_module(command, words[index + 1], index + 2, "python")
        if text.startswith("-m") and len(text) > 2:
            return interpret_module(command, words[index], index + 1, "python", begin=2)
        if text == "-c" or text == "-":
            return None
        if text in ("-W", "-X"):
            index += 2
        elif text.startswith("-") and set(text[1:]) <= PYTHON_BOOLEAN_OPTIONS | set("WX"):
            index += 1
        else:
            break
    if index >= len(words) or not words[index].text.endswith(".py"):
        return None
    return Launch(
        "python", command, target=words[index], target_kind="script", arguments=words[index + 1 :]
    )


def interpret_module(
    command: ExpandedCommand, module_word: ShellWord, after: int, launcher: str, begin: int = 0
) -> Launch | None:
    module = module_word.text[begin:]
    words = command.words
    known = KNOWN_MODULES.get(module)
    if known == "torchrun":
        return interpret_torchrun(command, after, "torchrun")
    if known == "accelerate":
        return interpret_accelerate(command, after)
    if known == "deepspeed":
        return interpret_deepspeed(command, after)
    if known == "axolotl":
        return with_positional_config(Launch("axolotl", command), words[after:])
    if known == "llamafactory":
        return with_positional_config(Launch("llamafactory", command), words[after:])
    return Launch(
        launcher, command, target=module_word, target_kind="module", arguments=words[after:]
    )


def interpret_torchrun(command: ExpandedCommand, start: int, launcher: str) -> Launch | None:
    options, index = read_options(command.words, start, booleans=TORCHRUN_BOOLEANS)
    return launched_program(
        Launch(launcher, command, options=options),
        index,
        module="module" in options or "m" in options,
    )


def interpret_accelerate(command: ExpandedCommand, start: int) -> Launch | None:
    options, index = read_options(command.words, start, booleans=ACCELERATE_BOOLEANS)
    return launched_program(
        Launch("accelerate", command, options=options),
        index,
        module="module" in options or "m" in options,
    )


def interpret_deepspeed(command: ExpandedCommand, start: int) -> Launch | None:
    options, index = read_options(command.words, start, booleans=DEEPSPEED_BOOLEANS)
    return launched_program(
        Launch("deepspeed", command, options=options), index, module="module" in options
    )


def launched_program(launch: Launch, index: int, *, module: bool) -> Launch | None:
    """What a distributed launcher starts: a script, a module or (torchrun --no_python) a
    program such as `llamafactory-cli`."""
    words = launch.command.words
    if index >= len(words):
        return launch
    first = words[index]
    if module:
        inner = interpret_module(launch.command, first, index + 1, launch.launcher)
        if inner is not None and inner.launcher in ("axolotl", "llamafactory"):
            return adopt_launcher(inner, launch)
        return inner
    if not first.text.endswith(".py"):
        nested = interpret_command(
            ExpandedCommand(
                words[index:],
                launch.command.environment,
                launch.command.raw,
                launch.command.working_directory,
                launch.command.variables,
            )
        )
        if nested is not None:
            return adopt_launcher(nested, launch)
    launch.target = first
    launch.target_kind = "script" if first.text.endswith(".py") else "module"
    launch.arguments = words[index + 1 :]
    return launch


def adopt_launcher(inner: Launch, outer: Launch) -> Launch:
    """A training CLI started by a distributed launcher keeps the launcher's world size."""
    merged = dict(outer.options)
    merged.update(inner.options)
    inner.options = merged
    inner.outer_launcher = outer.launcher
    return inner


def with_config_option(launch: Launch, words: list[ShellWord]) -> Launch:
    """`trl sft --config x.yaml --flag v ...`: the config is an option."""
    launch.arguments = words
    options = program_options(words)
    config = options.get("config")
    if config is not None and config.value is not None:
        launch.target = config.value.word
        launch.target_kind = "config"
    return launch


def with_positional_config(launch: Launch, words: list[ShellWord]) -> Launch:
    """`axolotl train x.yml ...` / `llamafactory-cli train x.yaml key=value`: the first
    positional word naming a YAML or JSON file is the config (`--deepspeed ds.json` is not)."""
    position = 0
    while position < len(words):
        text = words[position].text
        if text.startswith("-"):
            follows = words[position + 1].text if position + 1 < len(words) else "-"
            position += 1 if "=" in text or follows.startswith("-") else 2
            continue
        if text.endswith(CONFIG_SUFFIXES):
            launch.target = words[position]
            launch.target_kind = "config"
            launch.arguments = words[:position] + words[position + 1 :]
            return launch
        position += 1
    launch.arguments = words
    return launch


def interpret_llamafactory(command: ExpandedCommand, start: int) -> Launch | None:
    words = command.words
    if start >= len(words) or words[start].text != "train":
        return None
    return with_positional_config(
        Launch("llamafactory", command, subcommand="train"), words[start + 1 :]
    )


def interpret_tune(command: ExpandedCommand, start: int) -> Launch | None:
    """`tune run [torchrun options] <recipe> --config <file or built-in name> [key=value]`."""
    options, index = read_options(command.words, start, booleans=TORCHRUN_BOOLEANS)
    words = command.words
    if index >= len(words):
        return None
    launch = Launch("tune", command, options=options, subcommand=words[index].text)
    rest = words[index + 1 :]
    launch.arguments = rest
    config = program_options(rest).get("config")
    if config is not None and config.value is not None:
        launch.target = config.value.word
        launch.target_kind = "config"
    return launch


def interpret_litgpt(command: ExpandedCommand, start: int) -> Launch:
    words = command.words
    subcommand = words[start].text
    rest = words[start + 1 :]
    if (
        subcommand == "finetune"
        and rest
        and rest[0].text in ("lora", "full", "adapter", "adapter_v2")
    ):
        subcommand = f"finetune_{rest[0].text}"
        rest = rest[1:]
    elif subcommand == "finetune":
        subcommand = "finetune_lora"  # `litgpt finetune` is LoRA fine-tuning
    launch = Launch("litgpt", command, subcommand=subcommand)
    return with_config_option(launch, rest)


# --------------------------------------------------------------------------------------------
# 4. the plan


LAUNCHER_FRAMEWORKS = {
    "llamafactory": "llamafactory",
    "axolotl": "axolotl",
    "tune": "torchtune",
    "litgpt": "litgpt",
    "trl": "trl",
}
OVERRIDE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
FILE_VALUE_HINTS = ("config", "deepspeed", "file", "path", "dir")


def extract_shell_plan(
    path: Path, text: str | None = None, *, settings: ProjectSettings | None = None
) -> TrainingPlan:
    """The TrainingPlan a launcher script describes, with the script or config it starts when
    that file can be found. Never raises."""
    path = Path(path)
    problems: list[str] = []
    if text is None:
        text = read_text_file(path, problems)
    if text is None:
        return plan_from_problems(path, "shell", settings, problems)
    try:
        return ShellPlanReader(path, text).plan(settings)
    except RecursionError:
        return plan_from_problems(path, "shell", settings, ["the file nests too deeply to read"])
    except Exception as error:  # a gap in the reader must not take the editor down
        problem = f"internal error while reading the script: {error!r}"
        return plan_from_problems(path, "shell", settings, [problem])


class ShellPlanReader:
    """Reads one shell file: picks its training launch and gathers what it and the files it
    starts say, then builds the plan."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.text = text
        self.settings: list[Setting] = []
        self.readings: list[ConfigReading] = []
        self.problems: list[str] = []
        self.written_files: dict[str, HereDocument] = {}  # `cat > ds.json <<EOF`
        self.framework = "hf"
        self.config_class: str | None = None
        # the calls a launched script makes, for the builder to point its defaults at
        self.call_ranges: dict[str, SourceRange | None] = {}

    # -- the whole file

    def plan(self, project_settings: ProjectSettings | None) -> TrainingPlan:
        launch = self.choose_launch()
        if launch is None:
            self.problems.append(
                "no training command found (python, torchrun, accelerate launch, deepspeed, "
                "llamafactory-cli, tune run, trl, axolotl or litgpt)"
            )
        else:
            self.read_launch(launch)
        builder = PlanBuilder()
        builder.trainer_range = self.call_ranges.get("trainer")
        builder.model_range = self.call_ranges.get("model")
        builder.lora_range = self.call_ranges.get("lora")
        builder.quantization_range = self.call_ranges.get("quantization")
        if project_settings is not None:
            apply_project_settings(builder, project_settings)
        for setting in self.settings:
            builder.set(setting.key, setting.value, setting.source, setting.range, setting.note)
        for reading in self.readings:
            if reading.range_path is not None:
                apply_file_pragmas(builder, reading.text, reading.range_path)
        apply_file_pragmas(builder, self.text, None)
        plan = builder.build(
            str(self.path),
            "shell",
            self.framework,
            config_class=self.config_class
            or FRAMEWORK_CONFIG_CLASSES.get(self.framework, "TrainingArguments"),
        )
        for problem in self.problems:
            if problem not in plan.problems:
                plan.problems.append(problem)
        return plan

    def choose_launch(self) -> Launch | None:
        scanner = ShellScanner(self.text)
        commands = scanner.commands()
        self.problems.extend(scanner.problems)
        launches: list[Launch] = []
        for command in ShellExpander(self.text).expanded_commands(commands):
            for target in command.raw.output_targets:
                for document in command.raw.here_documents:
                    name = "".join(
                        part.text for part in target.parts if isinstance(part, LiteralPart)
                    )
                    self.written_files[name] = document
            launch = interpret_command(command)
            if launch is not None:
                launches.append(launch)
        if not launches:
            return None
        best = max(launch.priority for launch in launches)
        chosen = [launch for launch in launches if launch.priority == best]
        if len(chosen) > 1:
            first_line = self.line_of(chosen[0].command.words[0].start)
            self.problems.append(
                f"{len(chosen)} training commands in this file; the first one "
                f"(line {first_line + 1}) is read"
            )
        return chosen[0]

    # -- one launch

    def read_launch(self, launch: Launch) -> None:
        self.framework = LAUNCHER_FRAMEWORKS.get(launch.launcher, "hf")
        if launch.launcher == "trl" and launch.subcommand is not None:
            self.config_class = TRL_COMMANDS[launch.subcommand]
        self.read_world_size(launch)
        self.read_launcher_options(launch)
        directory = self.working_directory(launch)
        overrides, positionals = self.argument_overrides(launch)
        target_path = self.target_path(launch, directory)
        if launch.target_kind == "script" and target_path is not None:
            self.read_script(launch, target_path, overrides, positionals, directory)
            return
        builtin_config: ShellWord | None = None
        if launch.target_kind == "config" and target_path is None and launch.target is not None:
            if launch.launcher == "tune":
                builtin_config = launch.target
            else:
                self.problem_at(launch.target, f"'{launch.target.text}' not found")
        elif launch.target_kind in ("script", "module") and launch.target is not None:
            self.problem_at(
                launch.target,
                f"'{launch.target.text}' not found next to this file; only the command line "
                "is read",
            )
        config_path = target_path if launch.target_kind == "config" else None
        if config_path is None:
            config_path = self.positional_config(positionals, directory)
        self.read_config_with_overrides(config_path, overrides, directory, launch)
        if builtin_config is not None:
            self.read_torchtune_builtin(builtin_config)

    def read_config_with_overrides(
        self,
        config_path: Path | None,
        overrides: list[Override],
        directory: Path,
        launch: Launch,
    ) -> None:
        framework = LAUNCHER_FRAMEWORKS.get(launch.launcher)
        if config_path is not None:
            reading = read_config(
                config_path,
                range_path=display_path(config_path),
                overrides=overrides,
                framework=framework,
                search_directories=[directory],
            )
        elif overrides or framework is not None:
            reading = read_config(
                self.path,
                "",
                overrides=overrides,
                framework=framework,
                search_directories=[directory],
            )
        else:
            return
        self.add_reading(reading)
        if launch.launcher == "litgpt" and launch.subcommand == "finetune_lora":
            self.settings.append(
                Setting(
                    "lora.enabled",
                    True,
                    Provenance.EXPLICIT,
                    self.word_range(launch.command.words[1]),
                    "litgpt finetune_lora",
                )
            )
            for key, value, note in LITGPT_LORA_DEFAULTS:
                self.settings.append(Setting(key, value, Provenance.DEFAULT, None, note))

    def add_reading(self, reading: ConfigReading) -> None:
        self.readings.append(reading)
        self.settings.extend(reading.settings)
        self.problems.extend(reading.problems)
        if reading.framework not in ("deepspeed", "accelerate") and (
            reading.settings or reading.range_path is not None
        ):
            self.framework = reading.framework

    def read_script(
        self,
        launch: Launch,
        script: Path,
        overrides: list[Override],
        positionals: list[WordSlice],
        directory: Path,
    ) -> None:
        """A Python script: its own plan, then a YAML it is given, then the flags; a flag
        beats what the script leaves to a default or an argparse default, not what it
        hard-codes."""
        from llmmem.extract.python import extract_python_plan

        script_text = read_text_file(script, self.problems, display_path(script))
        if script_text is None:
            self.read_config_with_overrides(None, overrides, directory, launch)
            return
        script_plan = extract_python_plan(script, script_text)
        script_settings = settings_of_plan(script_plan, display_path(script))
        flag_settings = self.flag_settings_for_script(script_plan, overrides, directory, launch)
        config_path = self.positional_config(positionals, directory)
        if config_path is not None:
            reading = read_config(
                config_path,
                range_path=display_path(config_path),
                search_directories=[directory],
            )
            self.readings.append(reading)
            self.problems.extend(reading.problems)
            script_settings.extend(reading.settings)
        self.settings.extend(flag_settings)
        self.settings.extend(script_settings)
        self.framework = script_plan.framework
        self.call_ranges = {
            "trainer": in_file(script_plan.trainer_range, display_path(script)),
            "model": in_file(script_plan.model_range, display_path(script)),
            "lora": in_file(
                script_plan.lora.range if script_plan.lora else None, display_path(script)
            ),
            "quantization": in_file(
                script_plan.quantization.range if script_plan.quantization else None,
                display_path(script),
            ),
        }
        self.problems.extend(
            f"{display_path(script)}: {problem}" for problem in script_plan.problems
        )

    def flag_settings_for_script(
        self,
        script_plan: TrainingPlan,
        overrides: list[Override],
        directory: Path,
        launch: Launch,
    ) -> list[Setting]:
        """Flags as plan settings: through the script's own argparse options where it has
        them, else through the HF names (HfArgumentParser scripts take TrainingArguments
        fields as flags)."""
        argparse_keys = argparse_options_of(script_plan)
        mapped: list[Override] = []
        settings: list[Setting] = []
        for override in overrides:
            name = ".".join(str(step) for step in override.path)
            key = argparse_keys.get(name)
            if key == "distributed.deepspeed_config":
                # the script's own --deepspeed option: the file is read all the same
                mapped.append(Override(("deepspeed",), override.value, override.range))
            elif key is not None:
                settings.append(
                    Setting(
                        key,
                        override.value,
                        Provenance.EXPLICIT,
                        override.range,
                        f"--{name} on the command line",
                    )
                )
            else:
                mapped.append(override)
        if mapped:
            reading = read_config(
                self.path, "", overrides=mapped, framework="hf", search_directories=[directory]
            )
            self.readings.append(reading)
            self.problems.extend(reading.problems)
            settings.extend(
                setting for setting in reading.settings if setting.source is not Provenance.DEFAULT
            )
        return settings

    # -- launcher options

    def read_world_size(self, launch: Launch) -> None:
        options = launch.options
        environment = {**launch.command.variables, **launch.command.environment}
        processes: WordSlice | None = None
        nodes: WordSlice | None = None
        total = False
        if launch.uses("torchrun", "tune") or "nproc_per_node" in options:
            processes = self.option_value(options, "nproc_per_node")
            nodes = self.option_value(options, "nnodes")
        if launch.uses("accelerate") or "num_processes" in options:
            processes = self.option_value(options, "num_processes") or processes
            total = "num_processes" in options
        if launch.uses("deepspeed") or "num_gpus" in options:
            processes = self.option_value(options, "num_gpus") or processes
            nodes = self.option_value(options, "num_nodes") or nodes
            include = self.option_value(options, "include")
            if processes is None and include is not None:
                devices = include.text.split("@")[0].split(":", 1)[-1].count(",") + 1
                self.settings.append(
                    Setting(
                        "distributed.world_size",
                        devices,
                        Provenance.EXPLICIT,
                        self.slice_range(include),
                        f"--include {include.text}",
                    )
                )
                return
        if launch.launcher == "llamafactory" and processes is None:
            processes = self.environment_value(environment, "NPROC_PER_NODE")
            nodes = self.environment_value(environment, "NNODES")
        if launch.launcher == "trl":
            trl_options = program_options(launch.arguments)
            if "num_processes" in trl_options:
                processes = self.option_value(trl_options, "num_processes")
                total = True
        if launch.launcher == "python" and launch.scheduler_options and processes is None:
            self.read_scheduler_tasks(launch.scheduler_options)
            return
        if processes is not None and processes.text in ("gpu", "auto"):
            processes = None
        if processes is None:
            self.world_size_from_visible_devices(launch, environment)
            return
        count = self.integer(processes, "the number of processes")
        if count is None:
            return
        node_count = self.integer(nodes, "the number of nodes") if nodes is not None else None
        if node_count is not None and not total and node_count > 1:
            note = f"{count} per node × {node_count} nodes"
            self.settings.append(
                Setting(
                    "distributed.world_size",
                    count * node_count,
                    Provenance.EXPLICIT,
                    self.slice_range(processes),
                    note,
                )
            )
            return
        self.settings.append(
            Setting(
                "distributed.world_size",
                count,
                Provenance.EXPLICIT,
                self.slice_range(processes),
                "",
            )
        )

    def read_scheduler_tasks(self, options: dict[str, CommandOption]) -> None:
        """One rank per task: `srun --ntasks 8`, `-N 2 --ntasks-per-node 4`, `mpirun -np 4`."""
        total = next(
            (
                value
                for name in ("ntasks", "n", "np")
                if (value := self.option_value(options, name))
            ),
            None,
        )
        if total is not None:
            count = self.integer(total, "the number of tasks")
            if count is not None:
                self.settings.append(
                    Setting(
                        "distributed.world_size",
                        count,
                        Provenance.EXPLICIT,
                        self.slice_range(total),
                        "one rank per task",
                    )
                )
            return
        per_node = self.option_value(options, "ntasks_per_node") or self.option_value(
            options, "npernode"
        )
        if per_node is None:
            return
        count = self.integer(per_node, "the number of tasks per node")
        nodes = self.option_value(options, "nodes") or self.option_value(options, "N")
        node_count = self.integer(nodes, "the number of nodes") if nodes is not None else 1
        if count is not None and node_count is not None:
            self.settings.append(
                Setting(
                    "distributed.world_size",
                    count * node_count,
                    Provenance.EXPLICIT,
                    self.slice_range(per_node),
                    f"{count} tasks per node × {node_count} nodes",
                )
            )

    def world_size_from_visible_devices(
        self, launch: Launch, environment: dict[str, ShellWord]
    ) -> None:
        """Launchers that start one process per visible GPU when not told how many."""
        if not launch.uses("torchrun", "tune", "accelerate", "llamafactory"):
            return
        if launch.uses("accelerate") and "multi_gpu" not in launch.options:
            return
        visible = environment.get("CUDA_VISIBLE_DEVICES")
        if visible is None or not visible.is_known or not visible.text.strip():
            return
        count = len([device for device in visible.text.split(",") if device.strip()])
        self.settings.append(
            Setting(
                "distributed.world_size",
                count,
                Provenance.EXPLICIT,
                self.word_range(visible),
                "one process per GPU in CUDA_VISIBLE_DEVICES",
            )
        )

    def read_launcher_options(self, launch: Launch) -> None:
        options = launch.options
        directory = self.working_directory(launch)
        config_file = self.option_value(options, "config_file")
        if launch.uses("accelerate") and config_file is not None:
            self.read_referenced_config(config_file, directory, expected="accelerate")
        mixed = self.option_value(options, "mixed_precision")
        if mixed is not None and mixed.text.lower() in ("bf16", "fp16"):
            self.settings.append(
                Setting(
                    mixed.text.lower(),
                    True,
                    Provenance.CONFIG,
                    self.slice_range(mixed),
                    "accelerate launch --mixed_precision: used where the script sets none",
                )
            )
        if "use_deepspeed" in options or "zero_stage" in options:
            stage = self.option_value(options, "zero_stage")
            if stage is not None and (count := self.integer(stage, "zero_stage")) is not None:
                self.settings.append(
                    Setting(
                        "distributed.zero_stage",
                        count,
                        Provenance.EXPLICIT,
                        self.slice_range(stage),
                    )
                )
            for name, key in (
                ("offload_optimizer_device", "distributed.offload_optimizer"),
                ("offload_param_device", "distributed.offload_params"),
            ):
                device = self.option_value(options, name)
                if device is not None:
                    self.settings.append(
                        Setting(
                            key,
                            device.text.lower() in ("cpu", "nvme"),
                            Provenance.EXPLICIT,
                            self.slice_range(device),
                            f"--{name} {device.text}",
                        )
                    )
            deepspeed_file = self.option_value(options, "deepspeed_config_file")
            if deepspeed_file is not None:
                self.read_deepspeed_file(deepspeed_file, directory)
        if "use_fsdp" in options:
            strategy = self.option_value(options, "fsdp_sharding_strategy")
            value = (
                FSDP_STRATEGY_NAMES.get(strategy.text.lower(), "full_shard")
                if strategy
                else "full_shard"
            )
            located = (
                self.slice_range(strategy)
                if strategy
                else self.word_range(options["use_fsdp"].flag)
            )
            self.settings.append(
                Setting("distributed.fsdp", value, Provenance.EXPLICIT, located, "--use_fsdp")
            )
            offload = self.option_value(options, "fsdp_offload_params")
            if offload is not None and offload.text.lower() in ("true", "1", "yes"):
                for key in ("distributed.offload_params", "distributed.offload_optimizer"):
                    self.settings.append(
                        Setting(key, True, Provenance.EXPLICIT, self.slice_range(offload))
                    )
        if launch.launcher == "trl":
            trl_options = program_options(launch.arguments)
            accelerate_config = trl_options.get("accelerate_config")
            if accelerate_config is not None and accelerate_config.value is not None:
                self.read_trl_accelerate_config(accelerate_config.value, directory)

    def read_trl_accelerate_config(self, value: WordSlice, directory: Path) -> None:
        """`trl sft --accelerate_config zero3`: TRL ships configs named by scheme."""
        name = value.text.lower()
        located = self.slice_range(value)
        bundled = re.fullmatch(r"zero([1-3])|fsdp([12])?|multi_gpu|single_gpu", name)
        if bundled is None:
            self.read_referenced_config(value, directory, expected="accelerate")
            return
        if bundled.group(1):
            self.settings.append(
                Setting(
                    "distributed.zero_stage",
                    int(bundled.group(1)),
                    Provenance.EXPLICIT,
                    located,
                    f"TRL's {name} config",
                )
            )
        elif name.startswith("fsdp"):
            self.settings.append(
                Setting(
                    "distributed.fsdp",
                    "full_shard",
                    Provenance.EXPLICIT,
                    located,
                    f"TRL's {name} config",
                )
            )

    def read_referenced_config(self, value: WordSlice, directory: Path, expected: str) -> None:
        target = self.find_file(value.text, directory)
        if target is None:
            self.problem_at_slice(value, f"'{value.text}' not found")
            return
        reading = read_config(
            target, range_path=display_path(target), search_directories=[directory]
        )
        if reading.framework != expected and reading.settings:
            self.problem_at_slice(value, f"'{value.text}' does not look like an {expected} config")
        self.readings.append(reading)
        self.settings.extend(reading.settings)
        self.problems.extend(reading.problems)

    def read_deepspeed_file(self, value: WordSlice, directory: Path) -> None:
        self.settings.append(
            Setting(
                "distributed.deepspeed_config",
                value.text,
                Provenance.EXPLICIT,
                self.slice_range(value),
            )
        )
        target = self.find_file(value.text, directory)
        if target is None:
            self.problem_at_slice(value, f"DeepSpeed config '{value.text}' not found")
            return
        reading = read_config(target, range_path=display_path(target))
        self.readings.append(reading)
        self.settings.extend(reading.settings)
        self.problems.extend(reading.problems)

    # -- the program's arguments

    def argument_overrides(self, launch: Launch) -> tuple[list[Override], list[WordSlice]]:
        """The program's `--name value` flags and `key=value` overrides as config overrides,
        and its positional words."""
        consumed = (
            {"config", "accelerate_config", "num_processes"}
            if launch.launcher in ("trl", "tune", "litgpt")
            else set()
        )
        overrides: list[Override] = []
        positionals: list[WordSlice] = []
        words = launch.arguments
        index = 0
        while index < len(words):
            word = words[index]
            text = word.text
            index += 1
            if text.startswith("--") and len(text) > 2:
                if "=" in text:
                    name = option_name(text.split("=", 1)[0])
                    values = [WordSlice(word, text.index("=") + 1)]
                else:
                    name = option_name(text)
                    values = []
                    while index < len(words) and self.is_flag_value(name, words[index]):
                        values.append(WordSlice(words[index]))
                        index += 1
                        if name not in LIST_FLAGS:
                            break
                if name in consumed:
                    continue
                override = self.flag_override(name, word, values)
                if override is not None:
                    overrides.append(override)
            elif (
                not text.startswith("-")
                and "=" in text
                and OVERRIDE_KEY.match(text.split("=", 1)[0])
            ):
                name = text.split("=", 1)[0].replace("-", "_")
                value = WordSlice(word, len(name) + 1)
                if not value.is_known:
                    self.unknown_value(word, f"{name}")
                    continue
                overrides.append(
                    Override(
                        tuple(name.split(".")),
                        parse_override_value(value.text),
                        self.slice_range(value),
                    )
                )
            elif text.startswith("-"):
                continue  # a short option the program reads itself
            else:
                positionals.append(WordSlice(word))
        if (
            launch.launcher == "litgpt"
            and positionals
            and not positionals[0].text.endswith(CONFIG_SUFFIXES)
        ):
            checkpoint = positionals.pop(0)
            overrides.insert(
                0, Override(("checkpoint_dir",), checkpoint.text, self.slice_range(checkpoint))
            )
        return overrides, positionals

    @staticmethod
    def is_flag_value(name: str, word: ShellWord) -> bool:
        text = word.text
        if text.startswith("-") and not _is_number(text):
            return False
        if text.endswith(CONFIG_SUFFIXES + (".py",)):
            return any(hint in name for hint in FILE_VALUE_HINTS)
        return "=" not in text or not OVERRIDE_KEY.match(text.split("=", 1)[0])

    def flag_override(self, name: str, flag: ShellWord, values: list[WordSlice]) -> Override | None:
        path = tuple(part for part in name.split(".") if part)
        if name == "deepspeed_config":
            path = ("deepspeed",)
        if not path:
            return None
        if not values:
            return Override(path, True, self.word_range(flag))
        unknown = [value for value in values if not value.is_known]
        if unknown:
            self.unknown_value(unknown[0].word, f"--{name}")
            return None
        if (
            path == ("deepspeed",)
            and values[0].text in self.written_files
            and not (self.find_file(values[0].text, Path(self.path.parent)))
        ):
            self.read_written_deepspeed(values[0])
            return None
        if len(values) == 1:
            return Override(path, values[0].text, self.slice_range(values[0]))
        first = self.slice_range(values[0])
        last = self.slice_range(values[-1])
        spanning = replace(first, end_line=last.end_line, end_col=last.end_col)
        return Override(path, [value.text for value in values], spanning)

    def read_written_deepspeed(self, value: WordSlice) -> None:
        """`cat > ds.json <<EOF ... EOF` then `--deepspeed ds.json`: the here-document is the
        DeepSpeed config, and its ranges are in this file."""
        document = self.written_files[value.text]
        self.settings.append(
            Setting(
                "distributed.deepspeed_config",
                value.text,
                Provenance.EXPLICIT,
                self.slice_range(value),
            )
        )
        body = self.text[document.start : document.end]
        first_line = self.line_of(document.start)
        reading = read_config(Path(value.text), body, range_path=HERE_DOCUMENT_PATH)
        for setting in reading.settings:
            located = setting.range
            if located is not None and located.path == HERE_DOCUMENT_PATH:
                located = replace(
                    located,
                    path=None,
                    start_line=located.start_line + first_line,
                    end_line=located.end_line + first_line,
                )
            self.settings.append(
                Setting(setting.key, setting.value, Provenance.EXPLICIT, located, setting.note)
            )
        self.problems.extend(
            problem.replace(HERE_DOCUMENT_PATH, f"here-document for {value.text}")
            for problem in reading.problems
        )

    def positional_config(self, positionals: list[WordSlice], directory: Path) -> Path | None:
        """`python train.py config.yaml` (HfArgumentParser.parse_yaml_file) and friends."""
        for positional in positionals:
            if positional.text.endswith(CONFIG_SUFFIXES):
                found = self.find_file(positional.text, directory)
                if found is None:
                    self.problem_at_slice(positional, f"'{positional.text}' not found")
                return found
        return None

    # -- built-in torchtune configs

    def read_torchtune_builtin(self, name_word: ShellWord) -> None:
        """`--config llama3_1/8B_lora`: a config shipped inside torchtune; its model and method
        follow from its name, the rest from torchtune's recipe defaults."""
        name = name_word.text
        located = self.word_range(name_word)
        family, _, variant = name.partition("/")
        match = re.match(r"^(?P<size>[0-9.]+[BbMm]|mini)_(?P<method>q?lora|dora|full)", variant)
        if not family or match is None:
            self.problem_at(name_word, f"torchtune config '{name}' not found")
            return
        method = match.group("method")
        prefix = {"lora": "lora_", "qlora": "qlora_", "dora": "dora_"}.get(method, "")
        size = match.group("size").lower().replace(".", "_")
        model_id, _ = torchtune_model(f"{prefix}{family}_{size}")
        note = f"torchtune built-in config {name}: model and method from its name"
        if model_id is not None:
            self.settings.append(Setting("model_id", model_id, Provenance.ASSUMED, located, note))
        method_settings: list[tuple[str, Any]] = []
        if method in ("lora", "qlora", "dora"):
            method_settings.append(("lora.enabled", True))
        if method == "qlora":
            method_settings += [("quantization.bits", 4), ("quantization.quant_type", "nf4")]
        for key, value in method_settings:
            self.settings.append(Setting(key, value, Provenance.ASSUMED, located, note))
        # what torchtune's shipped configs have in common; set after the recipe defaults, so
        # they replace them, and below anything the command line says
        for key, value, shared_note in TORCHTUNE_BUILTIN_COMMON:
            self.settings.append(Setting(key, value, Provenance.DEFAULT, located, shared_note))
        self.problems.append(
            f"{describe_offset(self.text, name_word.start)}: torchtune's built-in config "
            f"'{name}' is not read; copy it (`tune cp {name} .`) to have its values read"
        )

    # -- small things

    def working_directory(self, launch: Launch) -> Path:
        return self.path.parent / launch.command.working_directory

    def target_path(self, launch: Launch, directory: Path) -> Path | None:
        if launch.target is None or not launch.target.is_known:
            return None
        name = launch.target.text
        if launch.target_kind == "module":
            module_path = name.replace(".", "/")
            return self.find_file(f"{module_path}.py", directory) or self.find_file(
                f"{module_path}/__main__.py", directory
            )
        found = self.find_file(name, directory)
        if found is None and launch.launcher == "tune" and not name.endswith(CONFIG_SUFFIXES):
            found = self.find_file(f"{name}.yaml", directory)
        if found is not None and launch.target_kind == "module":
            launch.target_kind = "script"
        return found

    def find_file(self, name: str, directory: Path) -> Path | None:
        return resolve_reference(name, directory / "launch", [self.path.parent])

    def option_value(self, options: dict[str, CommandOption], name: str) -> WordSlice | None:
        option = options.get(name)
        if option is None or option.value is None:
            return None
        if not option.value.is_known:
            self.unknown_value(option.value.word, f"--{name}")
            return None
        return option.value

    def environment_value(self, environment: dict[str, ShellWord], name: str) -> WordSlice | None:
        word = environment.get(name)
        if word is None:
            return None
        if not word.is_known:
            self.unknown_value(word, name)
            return None
        return WordSlice(word)

    def integer(self, value: WordSlice | None, what: str) -> int | None:
        if value is None:
            return None
        text = value.text.split(":")[0].strip()  # torchrun --nnodes MIN:MAX: the fewest
        if text.isdigit() and int(text) > 0:
            return int(text)
        self.problem_at_slice(value, f"{what} must be a positive whole number, got '{value.text}'")
        return None

    def unknown_value(self, word: ShellWord, what: str) -> None:
        expansion = word.unknown[0] if word.unknown else word.text
        if expansion in ("$@", "$*"):
            return
        self.problems.append(
            f"{describe_offset(self.text, word.start)}: {what} comes from {expansion}, known "
            "only when the script runs; add a `# llmmem:` pragma to say what it is"
        )

    def problem_at(self, word: ShellWord, message: str) -> None:
        self.problems.append(f"{describe_offset(self.text, word.start)}: {message}")

    def problem_at_slice(self, value: WordSlice, message: str) -> None:
        start, _ = value.offsets()
        self.problems.append(f"{describe_offset(self.text, start)}: {message}")

    def line_of(self, offset: int) -> int:
        return offset_to_position(self.text, offset)[0]

    def offsets_range(self, start: int, end: int) -> SourceRange:
        start_line, start_col = offset_to_position(self.text, start)
        end_line, end_col = offset_to_position(self.text, end)
        return SourceRange(
            start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
        )

    def slice_range(self, value: WordSlice) -> SourceRange:
        return self.offsets_range(*value.offsets())

    def word_range(self, word: ShellWord) -> SourceRange:
        return self.offsets_range(*word.span())


HERE_DOCUMENT_PATH = "<here-document>"
TORCHTUNE_BUILTIN_COMMON: tuple[tuple[str, Any, str], ...] = (
    ("precision", "bf16-true", "torchtune's built-in configs train in dtype bf16"),
    (
        "gradient_checkpointing",
        True,
        "torchtune's built-in configs enable activation checkpointing",
    ),
    ("loss", "chunked", "torchtune's built-in configs use CEWithChunkedOutputLoss"),
)


def parse_override_value(text: str) -> Any:
    """`key=value` overrides are read as YAML values (`4` -> 4, `[q_proj,v_proj]` -> a list),
    as OmegaConf reads them for torchtune and LLaMA-Factory."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, str | int | float | bool | list) else text


def in_file(located: SourceRange | None, range_path: str) -> SourceRange | None:
    """A range of another file's plan, naming that file (ranges naming a third file stay)."""
    if located is None or located.path is not None:
        return located
    return replace(located, path=range_path)


def settings_of_plan(plan: TrainingPlan, range_path: str) -> list[Setting]:
    """A plan's values as settings again, their ranges naming the plan's file, so that a
    launcher's plan can take them in beside its own."""
    settings: list[Setting] = []

    def add(key: str, value: Sourced[Any] | None) -> None:
        if value is not None:
            located = in_file(value.range, range_path)
            settings.append(Setting(key, value.value, value.source, located, value.note))

    for name, value in plan.sourced_fields().items():
        add(name, value)
    for section, prefix in (
        (plan.lora, "lora."),
        (plan.quantization, "quantization."),
        (plan.distributed, "distributed."),
    ):
        if section is None:
            continue
        for item in dataclass_fields(section):
            field_value = getattr(section, item.name)
            if isinstance(field_value, Sourced):
                add(prefix + item.name, field_value)
    if plan.lora is not None:
        settings.append(Setting("lora.enabled", True, plan.lora.r.source, None))
    for name, value in plan.extra.items():
        if isinstance(value, Sourced):
            add(name, value)
    return settings


def argparse_options_of(plan: TrainingPlan) -> dict[str, str]:
    """Which plan key each of a script's argparse options feeds, from the notes the Python
    extractor leaves on `cli-default` values."""
    options: dict[str, str] = {}
    for key, value in settings_by_key(plan).items():
        if value.source is not Provenance.CLI_DEFAULT:
            continue
        for option in re.findall(r"--([A-Za-z0-9_\-.]+)", value.note):
            options[option.replace("-", "_")] = key
    return options


def settings_by_key(plan: TrainingPlan) -> dict[str, Setting]:
    return {setting.key: setting for setting in settings_of_plan(plan, plan.path)}
