"""Values a run's launch can change without editing the file: argparse arguments,
`HfArgumentParser`/`TrlParser` dataclasses, and environment variables. Their defaults are read
with the provenance `cli-default` and a note saying where the default is written."""

from __future__ import annotations

import ast
from dataclasses import replace

from llmmem.extract.python.findings import Findings
from llmmem.extract.python.libraries import Handler
from llmmem.extract.python.values import (
    ArgParserObject,
    ArgumentsParserObject,
    CallArgs,
    ConfigObject,
    DataclassClass,
    DataclassInstance,
    DictValue,
    Known,
    ListValue,
    NamespaceObject,
    Symbol,
    Unknown,
    Value,
    _combine_notes,
    _truth,
    settle,
)
from llmmem.extract.vocabulary import TRAINER_CONFIG_CLASSES, sequence_length_names
from llmmem.plan import Provenance

_SEQUENCE_NAMES = sequence_length_names()
# the destinations of a command-line argument that names the model a script trains
MODEL_ARGUMENT_NAMES = frozenset(
    {
        "model_name_or_path",
        "pretrained_model_name_or_path",
        "model_path",
        "model_name",
        "model_id",
        "base_model",
        "model",
    }
)


def argument_parser(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    return ArgParserObject()


def dataclass_parser(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    classes = args.get("dataclass_types", 0)
    items = classes.items if isinstance(classes, ListValue) else [classes] if classes else []
    return ArgumentsParserObject(list(items), args.node)


def environment_default(found: Findings, callee: Symbol, args: CallArgs) -> Value:
    variable = settle(args.get("key", 0))
    label = variable.value if variable is not None else "?"
    default = args.get("default", 1)
    if default is None:
        return Known(None, args.node, Provenance.EXPLICIT, f"environment variable {label} unset")
    if isinstance(default, Known):
        # like a command-line default: the launch can change it without editing the file
        note = f"default of environment variable {label}"
        return replace(
            default, source=Provenance.CLI_DEFAULT, note=_combine_notes(default.note, note)
        )
    return default


CALLS_BY_LEAF: dict[str, Handler] = {
    "HfArgumentParser": dataclass_parser,
    "TrlParser": dataclass_parser,
}


def deepspeed_arguments(found: Findings, callee: Symbol, args: CallArgs) -> Value | None:
    """`parser = deepspeed.add_config_arguments(parser)`: DeepSpeed adds its own options to the
    parser it is given and returns that parser (deepspeed/__init__.py `_add_core_arguments`,
    DeepSpeed 0.19.8: the switches `--deepspeed` and `--deepscale`, the paths
    `--deepspeed_config` and `--deepscale_config`, defaults False and None). The script's own
    options stay as they are."""
    parser = args.get("parser", 0)
    if not isinstance(parser, ArgParserObject):
        return None
    for flag in ("--deepspeed", "--deepscale"):
        note = f"{flag} not given (deepspeed.add_config_arguments)"
        parser.arguments.setdefault(flag[2:], Known(False, args.node, Provenance.CLI_DEFAULT, note))
    for flag in ("--deepspeed_config", "--deepscale_config"):
        note = f"{flag} has no default (deepspeed.add_config_arguments)"
        parser.arguments.setdefault(flag[2:], Known(None, args.node, Provenance.CLI_DEFAULT, note))
    return parser


CALLS_BY_NAME: dict[str, Handler] = {
    "deepspeed.add_config_arguments": deepspeed_arguments,
    "argparse.ArgumentParser": argument_parser,
    "ArgumentParser": argument_parser,
    "os.environ.get": environment_default,
    "os.getenv": environment_default,
    "os.environ.setdefault": environment_default,
}


# -- argparse --------------------------------------------------------------------------------


def argparse_method(found: Findings, parser: ArgParserObject, method: str, args: CallArgs) -> Value:
    if method == "add_argument":
        add_argument(found, parser, args)
    elif method in ("add_argument_group", "add_mutually_exclusive_group"):
        return parser
    elif method == "set_defaults":
        for name, value in args.keywords.items():
            if isinstance(value, Known):
                value = replace(value, source=Provenance.CLI_DEFAULT, note=f"default of {name}")
            parser.arguments[name] = value
    elif method in ("parse_args", "parse_known_args", "parse_intermixed_args"):
        namespace = NamespaceObject(dict(parser.arguments))
        if method == "parse_known_args":
            return ListValue([namespace, Unknown("other arguments")], args.node)
        return namespace
    return Unknown(f"parser.{method}()")


def add_argument(found: Findings, parser: ArgParserObject, args: CallArgs) -> None:
    flags = [settle(value) for value in args.positional]
    names = [flag.value for flag in flags if flag is not None and isinstance(flag.value, str)]
    if not names:
        return
    long_flags = [name for name in names if name.startswith("--")]
    flag = long_flags[0] if long_flags else names[0]
    destination = settle(args.keywords.get("dest")) if "dest" in args.keywords else None
    dest = str(destination.value) if destination is not None else flag.lstrip("-").replace("-", "_")
    action = settle(args.keywords.get("action")) if "action" in args.keywords else None
    action_name = action.value if action is not None else None
    value: Value
    if "default" in args.keywords:
        value = args.keywords["default"]
        if isinstance(value, Known):
            converted = value.value
            kind = args.keywords.get("type")
            if isinstance(kind, Symbol) and isinstance(converted, str):
                try:
                    converted = {"int": int, "float": float}.get(kind.name, str)(converted)
                except ValueError:
                    pass
            value = replace(
                value,
                value=converted,
                source=Provenance.CLI_DEFAULT,
                note=_combine_notes(value.note, f"default of {flag}"),
            )
    elif action_name in ("store_true", "store_false"):
        value = Known(
            action_name == "store_false",
            args.node,
            Provenance.CLI_DEFAULT,
            f"{flag} not given",
        )
    elif flag.startswith("-"):
        required = args.keywords.get("required")
        note = (
            f"{flag} is required and has no default: its value is given when the script is run"
            if required is not None and _truth(required)
            else f"{flag} has no default"
        )
        value = Known(None, args.node, Provenance.CLI_DEFAULT, note)
    else:
        value = Unknown(f"the command-line argument {flag}")
    parser.arguments[dest] = value
    if dest.lower() in MODEL_ARGUMENT_NAMES and isinstance(value, Known):
        if isinstance(value.value, str) and value.value.strip():
            found.command_line_models.append(value)
    if dest.lower() in _SEQUENCE_NAMES and isinstance(value, Known):
        if isinstance(value.value, int) and not isinstance(value.value, bool):
            found.command_line_lengths.append(value)


def dataclass_parser_method(
    found: Findings, parser: ArgumentsParserObject, method: str, args: CallArgs
) -> Value:
    reading = {
        "parse_args_into_dataclasses": "",
        "parse_args_and_config": "",
        "parse_args": "",
        "parse_yaml_file": "a YAML file",
        "parse_json_file": "a JSON file",
        "parse_dict": "",
    }
    if method not in reading:
        return Unknown(f"parser.{method}()")
    given = args.get("args", 0) if method == "parse_dict" else None
    overrides = given.entries if isinstance(given, DictValue) else {}
    if reading[method]:
        found.problem(
            args.node,
            f"arguments come from {reading[method]} read at run time; llmmem shows the "
            "dataclass defaults",
        )
    instances: list[Value] = []
    for item in parser.classes:
        instances.append(parsed_instance(found, item, parser.node, overrides))
    remaining = args.keywords.get("return_remaining_strings")
    if method == "parse_args_into_dataclasses" and remaining is not None and _truth(remaining):
        instances.append(Unknown("the command-line strings no dataclass reads"))
    return ListValue(instances, args.node)


def parsed_instance(
    found: Findings, item: Value, node: ast.Call, overrides: dict[str, Value]
) -> Value:
    owner = item.name if isinstance(item, DataclassClass) else "arguments"

    def command_line(fields: dict[str, Value]) -> dict[str, Value]:
        result: dict[str, Value] = {}
        for name, value in fields.items():
            if isinstance(value, Known) and value.source is Provenance.EXPLICIT:
                note = f"default of --{name} ({owner}.{name})"
                value = replace(value, source=Provenance.CLI_DEFAULT, note=note)
                if name.lower() in _SEQUENCE_NAMES and isinstance(value.value, int):
                    found.command_line_lengths.append(value)
            result[name] = value
        result.update(overrides)
        return result

    if isinstance(item, DataclassClass):
        fields = command_line(item.fields)
        if item.config_class is not None:
            config = ConfigObject(
                item.config_class, item.name, node, fields, from_command_line=True
            )
            found.configs.append(config)
            return config
        return DataclassInstance(item.name, fields)
    if isinstance(item, Symbol) and item.leaf in TRAINER_CONFIG_CLASSES:
        config = ConfigObject(item.leaf, item.leaf, node, dict(overrides), from_command_line=True)
        found.configs.append(config)
        return config
    return Unknown("arguments from the command line")
