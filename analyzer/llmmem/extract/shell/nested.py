"""Commands a command runs from a string: `bash -c "$CMD"`, `nohup bash -c "${CMD}" &`,
`enroot start ... bash -c "python -m torch.distributed.launch ..."`, `docker run ... sh -c
'...'`, `eval "$CMD"`.

The string, as the outer shell passes it (its variables expanded), is scanned as a script of its
own; each word of its commands is then moved back into the file: a character written in the
file keeps its offset (a flag inside the quoted string, a value inside `CMD="..."`), and one
that came out of an expansion covers that expansion. The launch read from it behaves as if it
were written in the file, so its ranges, problems and fixes point where the text is.
"""

from __future__ import annotations

from llmmem.extract.shell.expand import ExpandedCommand, Piece, ShellExpander, ShellWord
from llmmem.extract.shell.lexer import RawCommand, RawWord, ShellScanner

SHELLS = frozenset({"bash", "sh", "zsh", "dash"})
MAX_NESTED_CHARS = 100_000


def command_strings(command: ExpandedCommand) -> list[ShellWord]:
    """The strings a command hands to a shell to run (`bash -c STRING`, `eval STRING`)."""
    words = command.words
    found: list[ShellWord] = []
    for index, word in enumerate(words):
        name = word.text.rsplit("/", 1)[-1]
        if name in SHELLS and index + 2 < len(words):
            option = words[index + 1].text
            if option.startswith("-") and not option.startswith("--") and "c" in option:
                found.append(words[index + 2])
                break
        if index == 0 and name == "eval" and len(words) == 2:
            found.append(words[1])
            break
    return [word for word in found if " " in word.text and len(word.text) <= MAX_NESTED_CHARS]


def nested_commands(outer: ExpandedCommand, string: ShellWord) -> list[ExpandedCommand]:
    """The commands `string` holds, their words placed in the file (see the module doc)."""
    text = string.text
    scanner = ShellScanner(text)
    expander = ShellExpander(text)
    expander.variables = {}
    found: list[ExpandedCommand] = []
    for command in expander.expanded_commands(scanner.commands()):
        words = [_placed(word, string) for word in command.words]
        # where the command's words lie in the file (a new flag is written after the last,
        # inside the string), with what the outer command redirects and writes
        raw = RawCommand(
            [RawWord((), word.start, word.end) for word in words],
            outer.raw.output_targets,
            outer.raw.here_documents,
        )
        found.append(
            ExpandedCommand(
                words,
                {name: _placed(word, string) for name, word in command.environment.items()},
                raw,
                outer.working_directory,
                {**outer.variables, **outer.environment},
            )
        )
    return found


def _placed(word: ShellWord, string: ShellWord) -> ShellWord:
    """`word` (offsets in `string`'s text) with offsets in the file."""
    pieces = []
    for piece in word.pieces:
        start, end = string.span(piece.start, piece.end)
        verbatim = piece.verbatim and end - start == len(piece.text)
        pieces.append(Piece(piece.text, start, end, verbatim, piece.splittable))
    start, end = string.span(word.start, word.end) if word.end > word.start else (0, 0)
    if not pieces and end == 0:
        start, end = string.start, string.end
    # what the outer shell could not expand is missing from the string, not from each word
    return ShellWord(word.text, tuple(pieces), start, end, word.unknown)
