"""Shell launchers: the command line that starts training, read into a TrainingPlan.

    NGPUS=${NGPUS:-4}
    torchrun --nproc_per_node $NGPUS train.py \\
        --per_device_train_batch_size 8 --bf16

The script is read in layers, one module each, every one importing only those above it:
1. `lexer`: words as written, with POSIX shell quoting, keeping each word's offsets in the file
   (across backslash continuations, here-documents and redirections);
2. `expand`: words as the shell would pass them: assignments, `export`, `${VAR:-default}`,
   `${VAR:=default}`, `$((A * B))` and word splitting, every character remembering where it was
   written; `$(nvidia-smi ...)` and positional arguments are known only when the script runs;
3. `launchers`: which program a command runs (python, torchrun, `python -m
   torch.distributed.run`, accelerate launch, deepspeed, llamafactory-cli, tune run, trl,
   axolotl, litgpt, and the entrypoint of `ray job submit`) and how its options are taken apart;
4. `options`: what the launcher's own options say (world size, mixed precision, ZeRO, FSDP,
   the accelerate and DeepSpeed files they name), and the ranges and problems of words;
5. `reader`: the plan: the training script or config the launcher starts is read when it lies
   beside the shell file (or where the path points, relative to it), and the flags after it
   override what that file says; DeepSpeed-Chat's scripts and OpenRLHF's trainers have their own
   flags.
"""

from __future__ import annotations

from llmmem.extract.shell.expand import (
    ExpandedCommand,
    Piece,
    ShellExpander,
    ShellWord,
    evaluate_integer_expression,
)
from llmmem.extract.shell.launchers import (
    CONFIG_SUFFIXES,
    DEEPSPEED_CHAT_FLAGS,
    LIST_FLAGS,
    OVERRIDE_KEY,
    CommandOption,
    Launch,
    WordSlice,
    deepspeed_chat_meanings,
    interpret_command,
    is_deepspeed_chat,
    openrlhf_trainer_of,
    option_name,
    parse_override_value,
    program_options,
    read_options,
)
from llmmem.extract.shell.lexer import (
    HereDocument,
    RawCommand,
    RawWord,
    ShellScanner,
    describe_offset,
    offset_to_position,
)
from llmmem.extract.shell.reader import (
    ProgramWord,
    ShellPlanReader,
    argparse_options_of,
    extract_shell_plan,
    program_words,
    settings_by_key,
    settings_of_plan,
)

__all__ = [
    "CONFIG_SUFFIXES",
    "DEEPSPEED_CHAT_FLAGS",
    "LIST_FLAGS",
    "OVERRIDE_KEY",
    "CommandOption",
    "ExpandedCommand",
    "HereDocument",
    "Launch",
    "Piece",
    "RawCommand",
    "RawWord",
    "ShellExpander",
    "ShellPlanReader",
    "ShellScanner",
    "ShellWord",
    "WordSlice",
    "argparse_options_of",
    "deepspeed_chat_meanings",
    "describe_offset",
    "evaluate_integer_expression",
    "extract_shell_plan",
    "interpret_command",
    "is_deepspeed_chat",
    "offset_to_position",
    "openrlhf_trainer_of",
    "option_name",
    "parse_override_value",
    "program_options",
    "read_options",
    "settings_by_key",
    "settings_of_plan",
    "program_words",
    "ProgramWord",
]
