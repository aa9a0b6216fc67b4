"""Fixes for a shell launcher, written as flags on its command line.

    torchrun --nproc_per_node 4 train.py \\
        --per_device_train_batch_size 8

A lever (`fixes.CANDIDATES`) is spelled the way the program the launcher starts reads it:

- a Python script (`python`, `torchrun`, `accelerate launch`, `deepspeed`) reading
  `HfArgumentParser`/`TrlParser`, and `trl sft`: HF `TrainingArguments` flags
  (`--gradient_checkpointing`, `--optim adamw_bnb_8bit`), a boolean as the bare flag;
- a script with its own `argparse` options: only those options (a flag it does not define would
  stop it with "unrecognized arguments"), a `store_true` option as the bare flag;
- a DeepSpeed-Chat training script (`deepspeed main.py --zero_stage 3 --lora_dim 64 ...`, as
  `extract/shell` recognises it): the flags of its own argparse (the table in
  `extract/frameworks/deepspeed_chat.py`), and no fix where it has none;
- an OpenRLHF trainer (`deepspeed --module openrlhf.cli.train_dpo ...`): its own flags, flat
  (`--gradient_checkpointing`) or dotted (`--model.gradient_checkpointing_enable`) as the line
  already writes them (`extract/frameworks/openrlhf.py`, FIX_SPELLINGS);
- `tune run`: torchtune's `key=value` overrides (`enable_activation_checkpointing=True`),
  `llamafactory-cli train`: LLaMA-Factory's (`disable_gradient_checkpointing=false`),
  `litgpt`: its `--train.micro_batch_size 2` flags; keys and values from the framework's table
  in `rules/spellings` (both `tune run` and `llamafactory-cli train x.yaml` merge the overrides
  into the config with OmegaConf's dotlist, so a mapping is one `key.name=value` per entry:
  LLaMA-Factory src/llamafactory/v1/config/arg_parser.py `OmegaConf.from_cli`);
- `axolotl train`: values already on the command line only.

A flag already written gets its value replaced where it stands (`--batch_size 8`,
`--batch_size=8`, `batch_size=8`, inside its quotes); a value that comes from a variable
(`--batch_size $BATCH`) is changed at the variable's assignment when the variable is used only
there, else on the command line. A new flag goes after the command's last word, on a line of its
own (` \\` + newline, the last line's indent) when the command is written one flag per line.
Nothing else in the file changes: comments, quotes, continuations and line endings stay.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmmem.extract.frameworks.openrlhf import fix_spellings, uses_dotted_names
from llmmem.extract.shell import (
    CONFIG_SUFFIXES,
    Launch,
    ShellPlanReader,
    ShellWord,
    WordSlice,
    is_deepspeed_chat,
    openrlhf_trainer_of,
    option_name,
    parse_override_value,
    program_options,
    program_words,
    settings_by_key,
)
from llmmem.plan import Provenance, SourceRange
from llmmem.rules.finding import TextEdit
from llmmem.rules.spellings import HF, SPELLINGS, TRL, KeyWrite, Spelling
from llmmem.scenario import Analysis

# programs whose flags are HF TrainingArguments names: a script that reads them with one of these
HF_PARSERS = ("HfArgumentParser", "TrlParser", "parse_args_into_dataclasses")
# a script llmmem cannot read takes HF flags when its command line already uses some of them
HF_FLAG_NAMES = frozenset(
    {
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "output_dir",
        "num_train_epochs",
        "learning_rate",
        "max_steps",
    }
)
# the plan key each HF flag feeds, where a script's own argparse option may stand for it
PLAN_KEYS = {"bf16": "precision"}

# DeepSpeed-Chat's training scripts read only their own argparse flags: the levers they have a
# flag for, and none for the rest (`extract/frameworks/deepspeed_chat.py`, FIX_SPELLINGS)
DEEPSPEED_CHAT: dict[str, Spelling] = SPELLINGS["deepspeed-chat"]
ADD_ARGUMENT = re.compile(
    r"""\.add_argument\(\s*(?:['"]-[^'"]*['"]\s*,\s*)*['"]--([A-Za-z0-9_\-]+)['"]"""
)


@dataclass(frozen=True)
class Written:
    """A flag or `key=value` override on the command line."""

    name: str  # dashes stripped, `-` read as `_`: "optim", "model._component_"
    word: ShellWord
    value: WordSlice | None  # None: a bare flag


@dataclass(frozen=True)
class ScriptOption:
    """An option a launched script defines (`parser.add_argument("--batch-size", ...)`)."""

    spelled: str  # as the script defines it, dashes kept: "--batch-size"
    flag_only: bool  # `action="store_true"`: given bare


@dataclass(frozen=True)
class Dialect:
    style: str  # "flag" (`--name value`), "override" (`name=value`)
    true_text: str  # how a boolean true is written: "True", "true"
    bare_true: bool  # a new boolean flag is written bare
    table: dict[str, tuple[KeyWrite, ...]] | None  # lever -> keys
    script_options: dict[str, ScriptOption] | None = None  # plan key -> option (argparse)
    hf_flags: bool = True  # the program takes the table's names (HF's) it does not define itself
    add: bool = True  # flags not on the command line may be added
    defined: frozenset[str] | None = None  # the only flags that may be added (None: any)


def launcher_edits(analysis: Analysis, text: str, lever: str) -> list[TextEdit] | None:
    """The edits pulling `lever` on the command line of the file's training launch, or None
    where the launched program has no spelling for it here."""
    setup = analysis.setup
    if setup is None:
        return None
    if lever == "bf16" and analysis.gpu is not None and not analysis.gpu.bf16:
        return None
    reader = ShellPlanReader(Path(analysis.plan.path), text)
    try:
        launch = reader.choose_launch()
    except RecursionError:
        return None
    if launch is None:
        return None
    written = written_flags(launch)
    dialect = launcher_dialect(reader, launch, analysis, written)
    if dialect is None or dialect.table is None:
        return None
    writes = dialect.table.get(lever)
    if writes is None:
        return None
    config = _launched_config(reader, launch)
    if config is None:
        config = _torchtune_builtin(launch)
    spans: list[tuple[int, int, str]] = []
    added: list[str] = []
    for write in writes:
        key = ".".join(str(step) for step in write.path)
        option = _find_written(written, key, dialect)
        current = _current_value(option, config, write.path)
        value = write.value(setup, current) if callable(write.value) else write.value
        if value is None:
            return None
        if current is not None and current == value and type(current) is type(value):
            continue
        if option is not None:
            span = _value_span(text, option, value, dialect)
            if span is None:
                return None
            spans.append(span)
            continue
        if write.only_if_written and current is None:
            return None
        if not dialect.add:
            return None
        new = _new_flag(key, value, dialect)
        if new is None:
            return None
        added.append(new)
    if added:
        spans.append(_insertion(text, launch, added))
    if not spans:
        return None
    return _text_edits(text, spans)


# -- which flags the launched program reads


def launcher_dialect(
    reader: ShellPlanReader, launch: Launch, analysis: Analysis, written: list[Written]
) -> Dialect | None:
    launcher = launch.launcher
    if launcher == "tune":
        return Dialect("override", "True", False, _table("torchtune"))
    if launcher == "llamafactory":
        from llmmem.rules.spellings import config_dialect

        dialect = config_dialect(analysis.plan)
        if dialect not in ("llamafactory", "llamafactory-v1"):
            dialect = "llamafactory"
        return Dialect("override", "true", False, _table(dialect))
    if launcher == "litgpt":
        return Dialect("flag", "true", False, _table("litgpt"))
    if launcher == "axolotl":
        return Dialect("flag", "true", False, _table("axolotl"), add=False)
    if launcher == "trl":
        return Dialect("flag", "True", True, TRL)
    if launch.target_kind == "config":
        return None
    path, script_text = _launched_script(reader, launch)
    names = set(program_options(launch.arguments))
    trainer = openrlhf_trainer_of(launch)
    if trainer is not None:
        # OpenRLHF's trainers: their own flags, in the names the line already uses
        return Dialect("flag", "True", True, fix_spellings(trainer, uses_dotted_names(names)))
    if is_deepspeed_chat(launch, names, script_text):
        return _deepspeed_chat_dialect(script_text)
    return _script_dialect(launch, written, path, script_text)


def _table(dialect: str) -> dict[str, tuple[KeyWrite, ...]]:
    return SPELLINGS.get(dialect, {})


def _launched_script(reader: ShellPlanReader, launch: Launch) -> tuple[Path | None, str | None]:
    """The started script's path and text, where it is beside the file and readable."""
    if launch.target is None or launch.target_kind not in ("script", "module"):
        return None, None
    path = reader.target_path(launch, reader.working_directory(launch))
    if path is None:
        return None, None
    try:
        return path, path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return path, None


def _deepspeed_chat_dialect(script_text: str | None) -> Dialect:
    """DeepSpeed-Chat's own flags; where its script is beside the file, a flag is added only
    when the script declares it (`parser.add_argument("--gradient_checkpointing", ...)`)."""
    defined = None
    if script_text is not None:
        defined = frozenset(name.replace("-", "_") for name in ADD_ARGUMENT.findall(script_text))
    return Dialect("flag", "True", True, DEEPSPEED_CHAT, defined=defined)


def _script_dialect(
    launch: Launch, written: list[Written], path: Path | None, script_text: str | None
) -> Dialect:
    """HF flags for a script parsing them (or one not found whose command line uses them);
    only its own options for an argparse script. A script given a config file
    (`python train.py config.yaml`, read with `parse_yaml_file`) reads its settings from that
    file, not from flags: flags already written are edited, none is added."""
    given_config = _positional_config(launch)
    if script_text is None:
        hf = any(flag.name in HF_FLAG_NAMES for flag in written)
        return Dialect("flag", "True", True, HF, {}, hf_flags=hf, add=hf and not given_config)
    options = _script_options(path, script_text) if path is not None else {}
    hf = any(parser in script_text for parser in HF_PARSERS)
    return Dialect("flag", "True", True, HF, options, hf_flags=hf, add=not given_config)


def _positional_config(launch: Launch) -> bool:
    """Whether the program is given a YAML or JSON file as a positional argument."""
    words = launch.arguments
    index = 0
    while index < len(words):
        text = words[index].text
        index += 1
        if text.startswith("--") and "=" not in text:
            name = option_name(text)
            if index < len(words) and ShellPlanReader.is_flag_value(name, words[index]):
                index += 1
        elif not text.startswith("-") and text.endswith(CONFIG_SUFFIXES):
            return True
    return False


def _script_options(path: Path, script_text: str) -> dict[str, ScriptOption]:
    """Plan key -> the script's option feeding it, from the notes the Python reader leaves on
    `cli-default` values ("default of --batch-size", "--bf16 not given")."""
    from llmmem.extract.python import extract_python_plan

    plan = extract_python_plan(path, script_text)
    options: dict[str, ScriptOption] = {}
    for key, setting in settings_by_key(plan).items():
        if setting.source is not Provenance.CLI_DEFAULT:
            continue
        found = re.search(r"--([A-Za-z0-9_\-.]+)", setting.note)
        if found is None:
            continue
        flag_only = f"--{found.group(1)} not given" in setting.note
        options[key] = ScriptOption(f"--{found.group(1)}", flag_only)
    return options


def _script_option_for(key: str, dialect: Dialect) -> ScriptOption | None:
    if dialect.script_options is None:
        return None
    plan_key = PLAN_KEYS.get(key, key)
    option = dialect.script_options.get(plan_key) or (
        dialect.script_options.get("torch_dtype") if plan_key == "precision" else None
    )
    if option is None:
        return None
    if key == "bf16" and not (option.flag_only and "bf16" in option.spelled):
        return None  # `--precision fp32`-like options are not spelled from here
    return option


# -- the command line as written


def written_flags(launch: Launch) -> list[Written]:
    """The program's `--name value`, `--name=value`, bare `--name` and `key=value` words, read
    as `extract/shell` reads them (`program_words`)."""
    return [
        Written(item.name, item.word, item.values[0] if item.values else None)
        for item in program_words(launch.arguments)
        if item.kind in ("flag", "override")
    ]


def _find_written(written: list[Written], key: str, dialect: Dialect) -> Written | None:
    names = {key}
    option = _script_option_for(key, dialect)
    if option is not None:
        names.add(option_name(option.spelled))
    style_matches = [
        flag
        for flag in written
        if flag.name in names and flag.word.text.startswith("-") == (dialect.style == "flag")
    ]
    return style_matches[-1] if style_matches else None  # the last one wins


def _current_value(option: Written | None, config: Any, path: tuple[str | int, ...]) -> Any:
    if option is not None:
        if option.value is None:
            return True
        if not option.value.is_known:
            return None
        return parse_override_value(option.value.text)
    if config is None:
        return None
    found, current = config.lookup(path)
    return current if found else None


def _launched_config(reader: ShellPlanReader, launch: Launch) -> Any:
    """The positioned reading of the config the launcher starts, when it is beside the file."""
    if launch.target_kind != "config" or launch.target is None:
        return None
    path = reader.target_path(launch, reader.working_directory(launch))
    if path is None or not path.name.endswith(CONFIG_SUFFIXES):
        return None
    from llmmem.extract.yaml_positions import read_positioned_yaml

    try:
        return read_positioned_yaml(
            path.read_text(encoding="utf-8"), is_json=path.suffix == ".json"
        )
    except (OSError, UnicodeDecodeError, ValueError):
        return None


@dataclass(frozen=True)
class BuiltinConfig:
    """What a torchtune built-in config (`--config llama3_1/8B_lora`) is known to say: its
    model builder, from its name (torchtune's shipped `<family>/<size>_lora*` configs build
    `torchtune.models.<family>.lora_<family>_<size>`)."""

    component: str

    def lookup(self, path: tuple[str | int, ...]) -> tuple[bool, Any]:
        if path == ("model", "_component_"):
            return True, self.component
        return False, None


def _torchtune_builtin(launch: Launch) -> BuiltinConfig | None:
    if launch.launcher != "tune" or launch.target is None or launch.target_kind != "config":
        return None
    name = launch.target.text
    if name.endswith(CONFIG_SUFFIXES):
        return None
    family, _, variant = name.partition("/")
    match = re.match(r"^(?P<size>[0-9.]+[Bb]|mini)_lora(_single_device)?$", variant)
    if not family or match is None or not re.fullmatch(r"[a-z0-9_]+", family):
        return None
    size = match.group("size").lower().replace(".", "_")
    return BuiltinConfig(f"torchtune.models.{family}.lora_{family}_{size}")


# -- the edits


def _literal(value: Any, dialect: Dialect, written: str | None = None) -> str:
    if isinstance(value, bool):
        text = dialect.true_text if value else ("False" if dialect.true_text == "True" else "false")
        if written is not None and written.islower():
            text = text.lower()
        return text
    return str(value)


def _quoted(text: str) -> str:
    return text if re.fullmatch(r"[A-Za-z0-9_.,:/@%+\-\[\]]+", text) else shlex.quote(text)


def _value_span(
    text: str, option: Written, value: Any, dialect: Dialect
) -> tuple[int, int, str] | None:
    """Where the written value goes and its new text: the value's own characters when they
    are written as read, a variable's assignment used nowhere else, else the word on the
    command line."""
    if isinstance(value, dict | list):
        return None  # replacing a written mapping or list is left to the user
    if option.value is None:  # a bare flag: it says true already, or it is a list flag
        if value is True:
            return None
        return option.word.end, option.word.end, " " + _literal(value, dialect)
    slice_ = option.value
    if not slice_.is_known:
        return None  # `--batch_size $(...)`: known when the script runs, not replaced
    literal = _literal(value, dialect, slice_.text)
    start, end = slice_.offsets()
    word = slice_.word
    if start >= word.start and end <= word.end and text[start:end] == slice_.text and slice_.text:
        return start, end, literal
    variable = _variable_at(text, start)
    if (
        variable is not None
        and text[start:end] == slice_.text
        and _uses(text, variable, start) == 1
    ):
        return start, end, literal
    # the word as written on the command line: `$BATCH` -> `4`, `--batch_size=$B` -> `...=4`
    raw = text[word.start : word.end]
    if slice_.begin:
        equals = raw.find("=")
        if equals < 0:
            return None
        return word.start + equals + 1, word.end, _quoted(literal)
    return word.start, word.end, _quoted(literal)


ASSIGNED_AT = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]*)\+?=[\"']?(?:\$\{[A-Za-z_][A-Za-z0-9_]*:?[-=])?$"
)


def _variable_at(text: str, offset: int) -> str | None:
    """The variable a value written at `offset` is assigned to: `BATCH=8` and
    `BATCH=${BATCH:-8}` -> BATCH."""
    line_start = text.rfind("\n", 0, offset) + 1
    found = ASSIGNED_AT.search(text[line_start:offset])
    return found.group(1) if found else None


def _uses(text: str, variable: str, assigned_at: int) -> int:
    """How often `$variable` is read outside the line assigning it at `assigned_at`."""
    line_start = text.rfind("\n", 0, assigned_at) + 1
    line_end = text.find("\n", assigned_at)
    rest = text[:line_start] + (text[line_end:] if line_end >= 0 else "")
    return len(re.findall(rf"\$\{{?{re.escape(variable)}\b", rest))


def _new_flag(key: str, value: Any, dialect: Dialect) -> str | None:
    if isinstance(value, dict):  # a mapping, one override per key: `quant_config.name=bnb`
        if dialect.style != "override":
            return None
        entries = [_new_flag(f"{key}.{name}", item, dialect) for name, item in value.items()]
        return None if None in entries else " ".join(entry for entry in entries if entry)
    if isinstance(value, list):
        return None
    if dialect.style == "override":
        return f"{key}={_quoted(_literal(value, dialect))}"
    if dialect.defined is not None and key not in dialect.defined:
        return None  # the script does not declare the flag: it would stop on it
    option = _script_option_for(key, dialect)
    if option is not None:
        if option.flag_only:
            return option.spelled if value is True else None
        return f"{option.spelled} {_quoted(_literal(value, dialect))}"
    if not dialect.hf_flags:
        return None  # the script defines no such option: it would stop on an unknown flag
    if value is True and dialect.bare_true:
        return f"--{key}"
    return f"--{key} {_quoted(_literal(value, dialect))}"


def _insertion(text: str, launch: Launch, flags: list[str]) -> tuple[int, int, str]:
    """The new flags after the command's last word: on a continuation line of their own when
    the command is written one flag per line, else on the last word's line."""
    words = launch.command.raw.words
    last = words[-1]
    at = last.end
    line_start = text.rfind("\n", 0, last.start) + 1
    indent = re.match(r"[ \t]*", text[line_start:]).group()  # type: ignore[union-attr]
    previous_line_end = line_start - 1
    continued = previous_line_end > 0 and text[:previous_line_end].rstrip("\r").endswith("\\")
    if continued and indent:
        newline = "\r\n" if text[previous_line_end - 1 : previous_line_end] == "\r" else "\n"
        joined = "".join(f" \\{newline}{indent}{flag}" for flag in flags)
        return at, at, joined
    return at, at, "".join(f" {flag}" for flag in flags)


def _text_edits(text: str, spans: list[tuple[int, int, str]]) -> list[TextEdit] | None:
    from llmmem.rules.text_edits import line_starts, position

    spans = sorted(spans)
    for (_, first_end, _), (second_start, _, _) in zip(spans, spans[1:], strict=False):
        if second_start < first_end:
            return None
    starts = line_starts(text)
    edits: list[TextEdit] = []
    for start, end, new_text in spans:
        start_line, start_col = position(text, start, starts)
        end_line, end_col = position(text, end, starts)
        edits.append(
            TextEdit(
                range=SourceRange(
                    start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
                ),
                new_text=new_text,
            )
        )
    return edits
