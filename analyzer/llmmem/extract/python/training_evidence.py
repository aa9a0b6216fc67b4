"""Whether a script trains at all, from what it builds and the methods it calls.

A script that evaluates a trainer without training it, a helper module that builds a trainer
and returns it to another file, or a script that loads a model to save, merge or generate with
it describes no training step: its plan says why (`not_training`), and no estimate or finding
is given for it. Calls are counted as written anywhere in the module (`trainer.train()` under
a condition not known before run time still counts), so a file that may train is never
dismissed.
"""

from __future__ import annotations

import ast

from llmmem.extract.python.findings import Findings
from llmmem.extract.python.values import (
    CallArgs,
    DataclassInstance,
    NamespaceObject,
    Value,
)

# a method call that trains: Trainer.train, a loop's backward (loss.backward(),
# accelerator.backward(loss)), Lightning's Trainer.fit
TRAINING_CALLS = frozenset({"train", "backward", "fit"})
EVALUATION_CALLS = frozenset({"evaluate", "predict"})
# what a script does with a model it only loads: save it (a quantized or merged copy), merge
# an adapter into it, generate with it
LOADING_ONLY_CALLS = frozenset(
    {"save_pretrained", "push_to_hub", "merge_and_unload", "generate", "save_quantized"}
)


def why_not_training(found: Findings) -> str | None:
    """The reason the script trains nothing, or None where it may train."""
    called = found.method_names
    if found.bare_torch_model is not None and not (
        found.models or found.trainers or found.configs or found.loras or found.quants
    ):
        return (
            f"the model is {found.bare_torch_model}, a torch layer and not a language model "
            "(nothing here loads one)"
        )
    if called & TRAINING_CALLS:
        return None
    if found.trainers:
        evaluated = sorted(called & EVALUATION_CALLS)
        if evaluated:
            return (
                f"the script only evaluates: trainer.{evaluated[0]}() and no train() or "
                "backward pass"
            )
        if found.returned_trainer:
            return (
                "a helper module: it builds a trainer and returns it, and nothing here calls "
                "train() (the file that does is the one to check)"
            )
        return None
    built = (
        found.configs
        or found.optimizers
        or found.data_loaders
        or any(not lora.default_note.startswith("a trained adapter") for lora in found.loras)
    )
    if found.models and not built:
        done = sorted(called & LOADING_ONLY_CALLS)
        if done:
            return f"the script loads a model to {done[0]}() it, with no trainer or backward pass"
    return None


# the torch.nn classes a script can take for its whole model: layers and containers, never a
# language model
_TORCH_NN_PREFIXES = ("torch.nn.", "nn.")


def bare_torch_model(module: ast.Module) -> str | None:
    """`model = torch.nn.Linear(20, 1)`: the text of a torch layer the script assigns to a name
    that reads as its model (a tutorial's DDP or profiling loop), else None."""
    for node in ast.walk(module):
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
            continue
        names = [target.id for target in node.targets if isinstance(target, ast.Name)]
        if not any(name == "net" or "model" in name.lower() for name in names):
            continue
        called = ast.unparse(node.value.func)
        if called.startswith(_TORCH_NN_PREFIXES) and called.rsplit(".", 1)[-1][:1].isupper():
            text = ast.unparse(node.value)
            return text if len(text) <= 60 else called + "(...)"
    return None


# a helper of a module not read here that updates the arguments it is given and returns them
# (`script_args = apply_config_overrides(script_args, config)`)
_UPDATING_WORDS = ("override", "update", "merge", "apply")


def updated_arguments(leaf: str, args: CallArgs) -> Value | None:
    """The arguments object a helper not read here is given to update, when its name says so
    (`apply_config_overrides(script_args, config)`): the script goes on with that object, its
    values as parsed (what the helper changes is known only at run time); else None."""
    if not args.positional or not any(word in leaf.lower() for word in _UPDATING_WORDS):
        return None
    first = args.positional[0]
    if isinstance(first, (DataclassInstance, NamespaceObject)):
        return first
    return None


# the programs a script starts training with through subprocess or os.system
_LAUNCHER_PROGRAMS = frozenset(
    {
        "llamafactory-cli",
        "accelerate",
        "torchrun",
        "deepspeed",
        "tune",
        "axolotl",
        "litgpt",
        "swift",
        "trl",
        "python",
        "python3",
    }
)


def launched_command(module: ast.Module) -> tuple[str, ast.AST] | None:
    """A training command the script hands to subprocess or os.system (`['llamafactory-cli',
    'train', config_path]`): its text (a value not written as text reads as its name) and
    where it is written; None where there is none."""
    nodes = list(ast.walk(module))
    # a command written as one string counts where a call is given it (os.system("...")), not
    # in a usage text or a docstring
    given = {id(call.args[0]) for call in nodes if isinstance(call, ast.Call) and call.args}
    for node in nodes:
        words: list[str] = []
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            words = [_word(element) for element in node.elts]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) in given:
            words = node.value.split()
        if not words or words[0].rsplit("/", 1)[-1] not in _LAUNCHER_PROGRAMS:
            continue
        if _starts_training(words):
            return " ".join(words), node
    return None


# what follows a launcher's program for it to train (`accelerate launch`, `tune run`)
_TRAINING_SUBCOMMANDS = {
    "llamafactory-cli": {"train"},
    "accelerate": {"launch"},
    "tune": {"run"},
    "axolotl": {"train"},
    "litgpt": {"finetune", "finetune_lora", "finetune_full", "finetune_adapter", "pretrain"},
    "swift": {"sft", "rlhf", "pt"},
    "trl": {"sft", "dpo", "grpo", "kto", "reward", "rloo", "orpo"},
}
_TRAINING_SCRIPT_WORDS = ("train", "finetune", "fine_tune", "sft", "dpo", "grpo", "ppo", "lora")


def _starts_training(words: list[str]) -> bool:
    """`llamafactory-cli train x.yaml`, `accelerate launch train.py`, `torchrun ... sft.py`,
    `python train.py`: a launcher's training subcommand, or a script named like training."""
    program = words[0].rsplit("/", 1)[-1]
    if len(words) < 2 or program not in _LAUNCHER_PROGRAMS:
        return False
    subcommands = _TRAINING_SUBCOMMANDS.get(program)
    if subcommands is not None:
        return words[1] in subcommands
    scripts = [word.rsplit("/", 1)[-1].lower() for word in words[1:] if word.endswith(".py")]
    return any(word in script for script in scripts[:1] for word in _TRAINING_SCRIPT_WORDS)


def module_evidence(found: Findings, module: ast.Module) -> None:
    """What the whole module shows before it is run: a bare torch layer as its model, a
    training command it hands to subprocess."""
    found.bare_torch_model = bare_torch_model(module)
    found.launched_command = launched_command(module)


def _word(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ast.unparse(node).replace(" ", "")[:60] or "_"
