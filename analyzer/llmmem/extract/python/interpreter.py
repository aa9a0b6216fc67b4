"""The abstract interpreter: `ScriptReader` walks a module's statements in order and evaluates
its expressions to values (see `values`), calling into the library tables (`libraries`,
`arguments`) for the calls that build what decides memory. It knows Python; what a library call
means lives in the tables."""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmmem.extract.python.arguments import (
    CALLS_BY_LEAF as ARGUMENT_CALLS_BY_LEAF,
)
from llmmem.extract.python.arguments import (
    CALLS_BY_NAME,
    argparse_method,
    dataclass_parser_method,
)
from llmmem.extract.python.findings import Findings
from llmmem.extract.python.imports import exec_import, unbound_name
from llmmem.extract.python.libraries import (
    CALLS_BY_LEAF as LIBRARY_CALLS_BY_LEAF,
)
from llmmem.extract.python.libraries import (
    TOKENIZER_METHODS,
    Handler,
    config_class_of,
    config_default,
    make_trainer,
    model_method,
    named_like_tokenizer,
    optimizer,
    read_tokenizer_call,
    tokenizer_method,
)
from llmmem.extract.python.local_modules import LocalModules
from llmmem.extract.python.loops import counted_range, forget_fields, run_for, run_while
from llmmem.extract.python.source import SourceMap
from llmmem.extract.python.token_cuts import read_token_cut
from llmmem.extract.python.training_evidence import module_evidence, updated_arguments
from llmmem.extract.python.values import (
    _EXIT_CALLS,
    _STOP_WHEN,
    MAX_CALL_DEPTH,
    MAX_FUNCTION_RUNS,
    ArgParserObject,
    ArgumentsParserObject,
    CallArgs,
    ClassValue,
    ConfigObject,
    DataclassClass,
    DataclassInstance,
    DictValue,
    Flow,
    FunctionValue,
    Known,
    ListValue,
    ModelConfigView,
    ModelObject,
    NamespaceObject,
    Scope,
    Symbol,
    TokenizerObject,
    TrainerObject,
    Unknown,
    Value,
    _chosen_by,
    _combine_notes,
    _compare,
    _dotted_name,
    _ReadingStopped,
    _returns_nothing,
    _safe_binary,
    _terminates,
    _too_large,
    _truth,
    _weakest,
    max_steps,
    probe_answer,
    settle,
)
from llmmem.extract.vocabulary import TRAINER_CLASSES
from llmmem.plan import Provenance

# a call to a library by the last part of its name; both tables are entries, not code here
CALLS_BY_LEAF: dict[str, Handler] = {**LIBRARY_CALLS_BY_LEAF, **ARGUMENT_CALLS_BY_LEAF}


class ScriptReader(Findings):
    """Walks a module in order, evaluating what can be known before run time and recording the
    objects that decide memory (models, training configs, adapters, optimizers, trainers)."""

    def __init__(self, source: SourceMap, path: Path) -> None:
        super().__init__(source, path)
        self.module_scope = Scope()
        self.branch_notes: list[str] = []
        self.call_stack: list[FunctionValue] = []
        self.return_values: list[Value | None] = []
        self.function_runs = 0
        self.steps = 0  # statements and expressions evaluated, up to max_steps()
        self.max_steps = max_steps()
        self.abandoned = _STOP_WHEN.get()
        self.oversized: list[str] = []  # values given up on, for one note each
        self.functions: list[FunctionValue] = []
        # the project's modules it imports (shared with the readers of those modules)
        self.local_modules = LocalModules(path)
        # `from x import *` of a module not in the project: a name nothing binds may be one
        self.star_imports: list[str] = []

    # -- notes -------------------------------------------------------------------------------

    def literal(self, value: object, node: ast.AST | None) -> Known:
        note = self.branch_notes[-1] if self.branch_notes else ""
        return Known(value, node, Provenance.EXPLICIT, note)

    # -- statements --------------------------------------------------------------------------

    def run_module(self, module: ast.Module) -> None:
        self.module_scope.bind("__name__", Known("__main__", None))
        self.method_names = frozenset(
            node.func.attr
            for node in ast.walk(module)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        )
        module_evidence(self, module)  # a bare torch model, a command run through subprocess
        try:
            self.exec_block(module.body, self.module_scope)
            # functions nothing in the file calls (entry points for fire/typer/click, callbacks
            # handed to `dataset.map`, helpers of a library module) still describe the run
            for function in list(self.functions):
                if function.runs == 0:
                    self.call_function(function, None, None)
        except _ReadingStopped as stopped:
            self.problems.append(str(stopped))

    def step(self, node: ast.AST) -> None:
        """Count one statement or expression; past MAX_STEPS the reading stops."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise _ReadingStopped(
                f"stopped reading{self._at(node)} after {self.max_steps:,} steps (statements and "
                "expressions, function bodies once per call): the rest of the script was not read"
            )
        if self.steps % 1024 == 0 and self.abandoned is not None and self.abandoned():
            raise _ReadingStopped(f"stopped reading{self._at(node)}: the analysis was abandoned")

    def _at(self, node: ast.AST) -> str:
        where = self.source.range_of(node)
        return f" at line {where.start_line + 1}" if where is not None else ""

    def give_up(self, node: ast.AST | None, what: str) -> Unknown:
        """The unknown that stands for a value past a bound, noted once per kind."""
        if what not in self.oversized:
            self.oversized.append(what)
            self.problem(node, f"{what} was built; llmmem does not read it (treated as unknown)")
        return Unknown(what, node)

    def exec_block(self, body: list[ast.stmt], scope: Scope) -> Flow:
        for statement in body:
            try:
                flow = self.exec_statement(statement, scope)
            except RecursionError:
                self.problem(statement, "nested too deeply to read; skipped")
                flow = Flow.NORMAL
            if flow is not Flow.NORMAL:
                return flow
        return Flow.NORMAL

    def exec_statement(self, node: ast.stmt, scope: Scope) -> Flow:
        self.step(node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self.exec_import(node, scope)
        elif isinstance(node, ast.Assign):
            value = self.eval(node.value, scope)
            for target in node.targets:
                self.assign(target, value, scope)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.assign(node.target, self.eval(node.value, scope), scope)
        elif isinstance(node, ast.AugAssign):
            combined = ast.BinOp(left=_as_load(node.target), op=node.op, right=node.value)
            ast.copy_location(combined, node)
            combined.end_lineno = node.end_lineno
            combined.end_col_offset = node.end_col_offset
            self.assign(node.target, self.eval(combined, scope), scope)
        elif isinstance(node, ast.Expr):
            self.eval(node.value, scope)
            if isinstance(node.value, ast.Call) and _dotted_name(node.value.func) in _EXIT_CALLS:
                return Flow.STOP
        elif isinstance(node, ast.If):
            return self.exec_if(node, scope)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            return run_for(self, node, scope)
        elif isinstance(node, ast.While):
            return run_while(self, node, scope)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                value = self.eval(item.context_expr, scope)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value, scope)
            return self.exec_block(node.body, scope)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            flow = self.exec_block(getattr(node, "body", []), scope)
            if flow is Flow.NORMAL:
                flow = self.exec_block(getattr(node, "orelse", []), scope)
            self.exec_block(getattr(node, "finalbody", []), scope)
            return flow if flow in (Flow.RETURN, Flow.BREAK, Flow.CONTINUE) else Flow.NORMAL
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.define_function(node, scope)
        elif isinstance(node, ast.ClassDef):
            self.define_class(node, scope)
        elif isinstance(node, ast.Return):
            value = self.eval(node.value, scope) if node.value is not None else Known(None, None)
            if isinstance(value, TrainerObject):
                self.returned_trainer = True
            if self.return_values:
                self.return_values[-1] = value
            return Flow.RETURN
        elif isinstance(node, ast.Raise):
            return Flow.STOP
        elif isinstance(node, ast.Break):
            return Flow.BREAK
        elif isinstance(node, ast.Continue):
            return Flow.CONTINUE
        return Flow.NORMAL

    def exec_import(self, node: ast.Import | ast.ImportFrom, scope: Scope) -> None:
        exec_import(self, node, scope)

    def exec_if(self, node: ast.If, scope: Scope) -> Flow:
        test = self.eval(node.test, scope)
        truth = _truth(test)
        if truth is not None and isinstance(test, Known) and test.source is Provenance.CLI_DEFAULT:
            # decided by a command-line default: a branch that gives up (raise, exit, a bare
            # return) is what some command lines do, not the run the file describes
            taken, other = (node.body, node.orelse) if truth else (node.orelse, node.body)
            if _gives_up(taken) and not _gives_up(other):
                return self.exec_block(other, scope)
        if truth is None and probe_answer(node.test) is not None:
            truth = probe_answer(node.test)  # the run's files are not where llmmem reads
        if truth is True:
            return self.exec_block(node.body, scope)
        if truth is False:
            return self.exec_block(node.orelse, scope)
        # not known before run time: take the first branch, unless it is an error exit or a
        # guard that returns nothing (the rest of the function is the run)
        if _terminates(node.body) or (
            _returns_nothing(node.body) and not _returns_nothing(node.orelse)
        ):
            return self.exec_block(node.orelse, scope)
        condition = self.source.text_of(node.test, 50)
        self.branch_notes.append(f"inside `if {condition}`, assumed true")
        try:
            return self.exec_block(node.body, scope)
        finally:
            self.branch_notes.pop()

    def assign(self, target: ast.expr, value: Value, scope: Scope) -> None:
        if isinstance(target, ast.Name):
            scope.bind(target.id, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            has_star = any(isinstance(element, ast.Starred) for element in target.elts)
            items: list[Value] | None = None
            if isinstance(value, ListValue) and len(value.items) == len(target.elts):
                items = value.items
            elif isinstance(value, Known) and isinstance(value.value, (list, tuple)):
                if len(value.value) == len(target.elts):
                    items = [replace(value, value=item) for item in value.value]
            for index, element in enumerate(target.elts):
                if isinstance(element, ast.Starred):
                    self.assign(element.value, Unknown("starred assignment"), scope)
                elif items is not None and not has_star:
                    self.assign(element, items[index], scope)
                else:
                    self.assign(element, Unknown("unpacked from a value not known"), scope)
        elif isinstance(target, ast.Attribute):
            owner = self.eval(target.value, scope)
            self.set_attribute(owner, target.attr, value)
        elif isinstance(target, ast.Subscript):
            owner = self.eval(target.value, scope)
            key = settle(self.eval(target.slice, scope))
            if isinstance(owner, DictValue) and key is not None and isinstance(key.value, str):
                owner.entries[key.value] = value
            elif isinstance(owner, DictValue) and key is None:  # any entry may be this one
                why = f"may be replaced at{self._at(target)} by a key not known before run time"
                for name in owner.entries:
                    owner.entries[name] = Unknown(why, target)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, Unknown("starred assignment"), scope)

    def set_attribute(self, owner: Value, name: str, value: Value) -> None:
        if isinstance(owner, ConfigObject):
            owner.fields[name] = value
        elif isinstance(owner, NamespaceObject):
            owner.attributes[name] = value
        elif isinstance(owner, DataclassInstance):
            owner.fields[name] = value
        elif isinstance(owner, TokenizerObject) and name == "model_max_length":
            owner.model_max_length = value
        elif isinstance(owner, ModelConfigView):
            known = settle(value)
            if known is None:
                return
            if name == "use_cache":
                owner.model.use_cache = known
            elif name == "gradient_checkpointing":
                owner.model.checkpointing = known
            elif name in ("_attn_implementation", "attn_implementation"):
                owner.model.attention = known

    # -- definitions -------------------------------------------------------------------------

    def parameter_defaults(self, arguments: ast.arguments, scope: Scope) -> dict[str, Value]:
        """A function's or lambda's parameter defaults, evaluated where it is defined."""
        defaults: dict[str, Value] = {}
        positional = [*arguments.posonlyargs, *arguments.args]
        for parameter, default in zip(
            positional[len(positional) - len(arguments.defaults) :], arguments.defaults, strict=True
        ):
            defaults[parameter.arg] = self.eval(default, scope)
        for parameter, keyword_default in zip(
            arguments.kwonlyargs, arguments.kw_defaults, strict=True
        ):
            if keyword_default is not None:
                defaults[parameter.arg] = self.eval(keyword_default, scope)
        return defaults

    def define_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, scope: Scope) -> None:
        defaults = self.parameter_defaults(node.args, scope)
        decorators = " ".join(self.source.text_of(item, 200) for item in node.decorator_list)
        command_line = bool(re.search(r"\b(command|main|callback)\b", decorators))
        function = FunctionValue(node, scope, defaults, command_line=command_line)
        self.functions.append(function)
        scope.bind(node.name, function)

    def define_class(self, node: ast.ClassDef, scope: Scope) -> None:
        bases = [self.eval(base, scope) for base in node.bases]
        config_class: str | None = None
        trainer_class: str | None = None
        inherited: dict[str, Value] = {}
        for base in bases:
            if isinstance(base, Symbol):
                config_class = config_class or config_class_of(base.leaf)
                if base.leaf in TRAINER_CLASSES:
                    trainer_class = trainer_class or base.leaf
            elif isinstance(base, DataclassClass):
                config_class = config_class or base.config_class
                inherited.update(base.fields)
            elif isinstance(base, ClassValue):
                trainer_class = trainer_class or base.trainer_class
                config_class = config_class or base.config_class
        decorators = " ".join(self.source.text_of(item, 200) for item in node.decorator_list)
        is_dataclass = "dataclass" in decorators or config_class is not None
        if not is_dataclass:
            scope.bind(node.name, ClassValue(node.name, trainer_class, config_class))
            return
        fields = dict(inherited)
        class_scope = Scope(scope)
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                if statement.value is None:
                    continue
                value = self._field_default(statement.value, class_scope)
                note = f"default of {node.name}.{statement.target.id}"
                if isinstance(value, Known):
                    value = replace(value, note=_combine_notes(value.note, note))
                fields[statement.target.id] = value
        scope.bind(node.name, DataclassClass(node.name, fields, config_class, node))

    def _field_default(self, expression: ast.expr, scope: Scope) -> Value:
        if isinstance(expression, ast.Call):
            callee = self.eval(expression.func, scope)
            if isinstance(callee, Symbol) and callee.leaf == "field":
                for keyword in expression.keywords:
                    if keyword.arg == "default":
                        return self.eval(keyword.value, scope)
                    if keyword.arg == "default_factory":
                        return self._factory_default(keyword.value, scope)
                return Unknown("a dataclass field without a plain default")
        return self.eval(expression, scope)

    def _factory_default(self, expression: ast.expr, scope: Scope) -> Value:
        """`field(default_factory=lambda: ["q_proj", "v_proj"])`: what the factory returns,
        read whole where every part is known; `list`/`dict` give an empty one."""
        factory = self.eval(expression, scope)
        made: Value = Unknown("a dataclass field whose default_factory is not known")
        if isinstance(factory, FunctionValue):
            made = self.call_function(factory, None, None)
        elif isinstance(factory, Symbol) and factory.name in ("list", "tuple", "set"):
            made = Known([], expression)
        elif isinstance(factory, Symbol) and factory.name == "dict":
            made = Known({}, expression)
        known = settle(made) if isinstance(made, (ListValue, DictValue)) else None
        return known if known is not None else made

    # -- expressions -------------------------------------------------------------------------

    def eval(self, node: ast.expr | None, scope: Scope) -> Value:
        if node is not None:
            self.step(node)
        value = self._eval(node, scope)
        if isinstance(value, Unknown):
            if value.node is None and node is not None:
                return Unknown(value.reason, node)
            return value
        too_large = _too_large(value)
        if too_large is not None:
            return self.give_up(node, too_large)
        return value

    def _eval(self, node: ast.expr | None, scope: Scope) -> Value:
        if node is None:
            return Unknown("nothing")
        if isinstance(node, ast.Constant):
            return self.literal(node.value, node)
        if isinstance(node, ast.Name):
            found = scope.lookup(node.id)
            if found is None:
                return unbound_name(self, node)
            if isinstance(found, Symbol):
                return Symbol(found.name, node)
            return found
        if isinstance(node, ast.Attribute):
            return self.eval_attribute(node, scope)
        if isinstance(node, ast.Call):
            return self.eval_call(node, scope)
        if isinstance(node, ast.Subscript):
            return self.eval_subscript(node, scope)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items: list[Value] = []
            for element in node.elts:
                if isinstance(element, ast.Starred):
                    expanded = self.eval(element.value, scope)
                    if isinstance(expanded, ListValue):
                        items.extend(expanded.items)
                    else:
                        items.append(Unknown("a starred expression"))
                else:
                    items.append(self.eval(element, scope))
            return ListValue(items, node)
        if isinstance(node, ast.Dict):
            return self.eval_dict(node, scope)
        if isinstance(node, ast.JoinedStr):
            return self.eval_fstring(node, scope)
        if isinstance(node, ast.BinOp):
            return self.eval_binary(node, scope)
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand, scope)
            if isinstance(node.op, ast.Not):
                truth = _truth(operand)
                if truth is None:
                    return Unknown("a negated unknown")
                source = operand.source if isinstance(operand, Known) else Provenance.EXPLICIT
                return Known(not truth, node, source)
            known = settle(operand)
            if known is not None and isinstance(known.value, (int, float)):
                if isinstance(node.op, ast.USub):
                    return Known(-known.value, node, known.source, known.note)
                if isinstance(node.op, ast.UAdd):
                    return Known(+known.value, node, known.source, known.note)
            return Unknown("an operation on a value not known")
        if isinstance(node, ast.BoolOp):
            return self.eval_bool(node, scope)
        if isinstance(node, ast.Compare):
            return self.eval_compare(node, scope)
        if isinstance(node, ast.IfExp):
            return self.eval_conditional(node, scope)
        if isinstance(node, ast.NamedExpr):
            value = self.eval(node.value, scope)
            self.assign(node.target, value, scope)
            return value
        if isinstance(node, ast.Lambda):
            return FunctionValue(node, scope, self.parameter_defaults(node.args, scope))
        return Unknown(f"a {type(node).__name__} expression")

    def eval_attribute(self, node: ast.Attribute, scope: Scope) -> Value:
        owner = self.eval(node.value, scope)
        name = node.attr
        if isinstance(owner, Unknown):
            return Unknown(owner.reason)
        if isinstance(owner, Symbol):
            return Symbol(f"{owner.name}.{name}", node)
        if isinstance(owner, NamespaceObject):
            return owner.attributes.get(name, Unknown(f"no command-line argument `{name}`"))
        if isinstance(owner, DataclassInstance):
            return owner.fields.get(name, Unknown(f"{owner.name}.{name}"))
        if isinstance(owner, ConfigObject):
            if name in owner.fields:
                return owner.fields[name]
            return config_default(owner, name)
        if isinstance(owner, DataclassClass):
            return owner.fields.get(name, Unknown(f"{owner.name}.{name}"))
        if isinstance(owner, ModelObject):
            if name == "config":
                return ModelConfigView(owner)
            return Unknown(f"model.{name}")
        if isinstance(owner, ModelConfigView):
            if name == "use_cache" and owner.model.use_cache is not None:
                return owner.model.use_cache
            return Unknown(f"model.config.{name}")
        if isinstance(owner, TokenizerObject) and name == "model_max_length":
            return owner.model_max_length or Unknown("the tokenizer's model_max_length")
        if isinstance(owner, TrainerObject):
            if name == "model":
                return owner.args.get("model", 0) or Unknown("trainer.model")
            if name == "args":
                return owner.args.get("args", TRAINER_CLASSES[owner.class_name][1]) or Unknown(
                    "trainer.args"
                )
        return Unknown(f"attribute `{name}`")

    def eval_subscript(self, node: ast.Subscript, scope: Scope) -> Value:
        if isinstance(node.slice, ast.Slice):
            read_token_cut(self, node, scope)
        owner = self.eval(node.value, scope)
        key = settle(self.eval(node.slice, scope))
        if isinstance(owner, Symbol):
            if owner.name == "os.environ" and key is not None:
                return Unknown(f"environment variable {key.value}")
            if owner.name == "sys.argv" and key is not None and isinstance(key.value, int):
                return Unknown(f"sys.argv[{key.value}], a command-line argument")
            return Unknown(f"{owner.name}[...]")
        if isinstance(owner, Unknown):
            return Unknown(owner.reason)
        if key is None:
            return Unknown("a subscript not known")
        if isinstance(owner, DictValue) and isinstance(key.value, str):
            return owner.entries.get(key.value, Unknown(f"no key {key.value!r}"))
        if isinstance(owner, ListValue) and isinstance(key.value, int):
            if -len(owner.items) <= key.value < len(owner.items):
                return owner.items[key.value]
            return Unknown("an index out of range")
        if isinstance(owner, Known):
            try:
                return Known(owner.value[key.value], node, owner.source, owner.note)  # type: ignore[index]
            except Exception:
                return Unknown("a subscript not known")
        return Unknown("a subscript not known")

    def eval_dict(self, node: ast.Dict, scope: Scope) -> DictValue:
        result = DictValue({}, node)
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                expanded = self.eval(value_node, scope)
                self._merge_into(result, expanded, value_node)
                continue
            key = settle(self.eval(key_node, scope))
            if key is None or not isinstance(key.value, str):
                continue
            result.entries[key.value] = self.eval(value_node, scope)
        return result

    def _merge_into(self, target: DictValue, expanded: Value, node: ast.AST) -> None:
        if isinstance(expanded, DictValue):
            target.entries.update(expanded.entries)
            target.unread.extend(expanded.unread)
        elif isinstance(expanded, Known) and isinstance(expanded.value, dict):
            for key, item in expanded.value.items():
                target.entries[str(key)] = replace(expanded, value=item)
        elif isinstance(expanded, NamespaceObject):
            target.entries.update(expanded.attributes)
        else:
            reason = expanded.reason if isinstance(expanded, Unknown) else "not known"
            target.unread.append(f"`**{self.source.text_of(node)}` ({reason})")

    def eval_fstring(self, node: ast.JoinedStr, scope: Scope) -> Value:
        parts: list[str] = []
        known_parts: list[Known] = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                parts.append(part.value)
            elif (
                isinstance(part, ast.FormattedValue)
                and part.conversion == -1
                and part.format_spec is None
            ):
                known = settle(self.eval(part.value, scope))
                if known is None or not isinstance(known.value, (str, int, float)):
                    return Unknown("an f-string with parts not known")
                parts.append(str(known.value))
                known_parts.append(known)
            else:
                return Unknown("a formatted f-string")
        note = _combine_notes(*(part.note for part in known_parts))
        return Known("".join(parts), node, _weakest(known_parts), note)

    def eval_binary(self, node: ast.BinOp, scope: Scope) -> Value:
        left = self.eval(node.left, scope)
        right = self.eval(node.right, scope)
        if isinstance(node.op, ast.BitOr) and isinstance(left, DictValue):
            merged = DictValue(dict(left.entries), node, list(left.unread))
            self._merge_into(merged, right, node.right)
            return merged
        if isinstance(node.op, ast.Add) and isinstance(left, ListValue):
            if isinstance(right, ListValue):
                return ListValue([*left.items, *right.items], node)
        left_known, right_known = settle(left), settle(right)
        if left_known is None or right_known is None:
            return Unknown("arithmetic on a value not known")
        try:
            result = _safe_binary(node.op, left_known.value, right_known.value)
        except Exception:
            return Unknown("arithmetic llmmem does not evaluate")
        return Known(
            result,
            node,
            _weakest((left_known, right_known)),
            _combine_notes(left_known.note, right_known.note),
        )

    def eval_bool(self, node: ast.BoolOp, scope: Scope) -> Value:
        value: Value = Unknown("nothing")
        for operand in node.values:
            value = self.eval(operand, scope)
            truth = _truth(value)
            if truth is None:
                return value if isinstance(value, Unknown) else Unknown("a condition not known")
            if isinstance(node.op, ast.Or) and truth:
                return value
            if isinstance(node.op, ast.And) and not truth:
                return value
        return value

    def eval_compare(self, node: ast.Compare, scope: Scope) -> Value:
        left = settle(self.eval(node.left, scope))
        result = True
        operands: list[Known] = []
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = settle(self.eval(comparator, scope))
            if left is None or right is None:
                return Unknown("a comparison with a value not known")
            operands += [left, right]
            try:
                result = result and _compare(op, left.value, right.value)
            except Exception:
                return Unknown("a comparison llmmem does not evaluate")
            left = right
        # as sure as what it compares: a command-line default decides it only by default
        return Known(result, node, _weakest(operands))

    def eval_conditional(self, node: ast.IfExp, scope: Scope) -> Value:
        test = self.eval(node.test, scope)
        truth = _truth(test)
        if truth is not None:
            chosen = self.eval(node.body if truth else node.orelse, scope)
            decided = _chosen_by(chosen, test, self.source.text_of(node.test, 50))
            index = _argv_index(node.orelse if truth else node.body)
            if index is not None and isinstance(decided, Known):
                # `sys.argv[1] if len(sys.argv) > 1 else "org/model"`: a launcher's positional
                # word 1 replaces it (extract/shell/reader.py)
                note = f"default of sys.argv[{index}]"
                return replace(decided, note=_combine_notes(decided.note, note))
            return decided
        chosen = self.eval(node.body, scope)
        condition = self.source.text_of(node.test, 50)
        note = f"first branch of a conditional expression (`{condition}` is known only at run time)"
        if isinstance(chosen, Known):
            return replace(chosen, note=_combine_notes(chosen.note, note))
        if isinstance(chosen, Symbol):
            return Known(chosen.name, chosen.node, Provenance.EXPLICIT, note)
        return chosen

    # -- calls -------------------------------------------------------------------------------

    def eval_arguments(self, node: ast.Call, scope: Scope) -> CallArgs:
        args = CallArgs(node, [], {}, [])
        for argument in node.args:
            if isinstance(argument, ast.Starred):
                expanded = self.eval(argument.value, scope)
                if isinstance(expanded, ListValue):
                    args.positional.extend(expanded.items)
                else:
                    args.unread.append(f"`*{self.source.text_of(argument.value)}`")
                continue
            args.positional.append(self.eval(argument, scope))
        for keyword in node.keywords:
            if keyword.arg is None:
                merged = DictValue({}, keyword.value)
                self._merge_into(merged, self.eval(keyword.value, scope), keyword.value)
                args.keywords.update(merged.entries)
                args.unread.extend(merged.unread)
            else:
                args.keywords[keyword.arg] = self.eval(keyword.value, scope)
        return args

    def eval_call(self, node: ast.Call, scope: Scope) -> Value:
        if isinstance(node.func, ast.Attribute):
            owner = self.eval(node.func.value, scope)
            args = self.eval_arguments(node, scope)
            if isinstance(owner, Symbol):
                result = self.call_symbol(Symbol(f"{owner.name}.{node.func.attr}", node.func), args)
            else:
                result = self.call_method(owner, node.func.attr, args)
            if isinstance(owner, (Symbol, Unknown)) and (
                named_like_tokenizer(node.func.attr)
                or (
                    node.func.attr in TOKENIZER_METHODS
                    and named_like_tokenizer(_dotted_name(node.func.value))
                )
            ):
                read_tokenizer_call(self, args)  # `self.tokenizer(...)`, `tok.encode(...)`
        else:
            callee = self.eval(node.func, scope)
            args = self.eval_arguments(node, scope)
            result = self.call_value(callee, args, node)
            if isinstance(callee, (Symbol, Unknown)) and named_like_tokenizer(
                _dotted_name(node.func)
            ):
                read_tokenizer_call(self, args)  # a tokenizer handed in as a parameter
            if isinstance(callee, FunctionValue):
                return result  # the script's own function: its parameters got the callbacks
        self.follow_callbacks(args)
        return result

    def call_value(self, callee: Value, args: CallArgs, node: ast.Call) -> Value:
        if isinstance(callee, Symbol):
            return self.call_symbol(callee, args)
        if isinstance(callee, FunctionValue):
            return self.call_function(callee, args, node)
        if isinstance(callee, DataclassClass):
            return self.instantiate(callee, args)
        if isinstance(callee, ClassValue):
            if callee.trainer_class is not None:
                return make_trainer(self, callee.trainer_class, args)
            return Unknown(f"an instance of {callee.name}")
        if isinstance(callee, TokenizerObject):
            read_tokenizer_call(self, args)
            return Unknown("tokenized text")
        return Unknown("the result of a call")

    def follow_callbacks(self, args: CallArgs) -> None:
        """The script's functions and lambdas handed to a call (`ds.map(tokenize)`,
        `ds.map(lambda b: tokenizer(...))`) run there, once, with their parameters unknown:
        what they build or pass to a tokenizer is read where the script hands them over.
        `Dataset.map`'s `fn_kwargs={...}` are their keyword arguments."""
        callbacks = [
            value
            for values in (args.positional, args.keywords.values())
            for value in values
            if isinstance(value, FunctionValue) and value.runs == 0
        ]
        if not callbacks:
            return
        extra = args.keywords.get("fn_kwargs")
        given = None
        if isinstance(extra, DictValue) and extra.entries:
            given = CallArgs(args.node, [], dict(extra.entries), list(extra.unread))
        for callback in callbacks:
            if callback.runs == 0:
                self.call_function(callback, given, None)

    def call_function(
        self, function: FunctionValue, args: CallArgs | None, node: ast.Call | None
    ) -> Value:
        function.runs += 1
        if (
            function in self.call_stack
            or len(self.call_stack) >= MAX_CALL_DEPTH
            or self.function_runs >= MAX_FUNCTION_RUNS
        ):
            return Unknown(f"the result of {function.name}()")
        self.function_runs += 1
        local = Scope(function.scope)
        self.bind_parameters(function, args, local)
        self.call_stack.append(function)
        self.return_values.append(None)
        try:
            if isinstance(function.node, ast.Lambda):
                self.return_values[-1] = self.eval(function.node.body, local)
            else:
                self.exec_block(function.node.body, local)
        finally:
            self.call_stack.pop()
            result = self.return_values.pop()
        return result if result is not None else Unknown(f"the result of {function.name}()")

    def bind_parameters(self, function: FunctionValue, args: CallArgs | None, local: Scope) -> None:
        arguments = function.node.args
        positional = [*arguments.posonlyargs, *arguments.args]
        given_positional = list(args.positional) if args is not None else []
        given_keywords = dict(args.keywords) if args is not None else {}
        name = function.name
        for index, parameter in enumerate([*positional, *arguments.kwonlyargs]):
            if index < len(positional) and index < len(given_positional):
                local.bind(parameter.arg, given_positional[index])
            elif parameter.arg in given_keywords:
                local.bind(parameter.arg, given_keywords.pop(parameter.arg))
            elif parameter.arg in function.defaults:
                default = function.defaults[parameter.arg]
                if isinstance(default, Known):
                    if function.command_line:
                        note = f"default of --{parameter.arg} of {name}()"
                        default = replace(default, source=Provenance.CLI_DEFAULT, note=note)
                    else:
                        note = f"default of parameter `{parameter.arg}` of {name}()"
                        default = replace(default, note=_combine_notes(default.note, note))
                local.bind(parameter.arg, default)
            else:
                local.bind(parameter.arg, Unknown(f"parameter `{parameter.arg}` of {name}()"))
        if arguments.vararg is not None:
            local.bind(arguments.vararg.arg, ListValue(given_positional[len(positional) :], None))
        if arguments.kwarg is not None:
            local.bind(arguments.kwarg.arg, DictValue(given_keywords, None))

    def instantiate(self, cls: DataclassClass, args: CallArgs) -> Value:
        fields = dict(cls.fields)
        fields.update(args.keywords)
        if cls.config_class is not None:
            config = ConfigObject(cls.config_class, cls.name, args.node, fields, list(args.unread))
            self.configs.append(config)
            return config
        return DataclassInstance(cls.name, fields)

    def call_symbol(self, callee: Symbol, args: CallArgs) -> Value:
        for handler in (CALLS_BY_LEAF.get(callee.leaf), CALLS_BY_NAME.get(callee.name)):
            if handler is not None:
                result = handler(self, callee, args)
                if result is not None:
                    return result
        name = callee.name
        if name in ("fire.Fire", "typer.run") and args.positional:
            target = args.positional[0]
            if isinstance(target, FunctionValue):
                target.command_line = True
                return self.call_function(target, None, None)
            return Unknown("a command-line program")
        builtin = self.call_builtin(name, args)
        if builtin is not None:
            return builtin
        made = optimizer(self, callee, args)
        if made is not None:
            return made
        if updated_arguments(callee.leaf, args) is not None:
            return args.positional[0]  # `args = apply_overrides(args, cfg)`: the same object
        return Unknown(f"the result of {name}()")

    def call_builtin(self, name: str, args: CallArgs) -> Value | None:
        first = args.positional[0] if args.positional else None
        if name in ("int", "float", "str", "bool") and first is not None:
            known = settle(first)
            if known is None:
                return Unknown(f"{name}() of a value not known")
            converter: Any = {"int": int, "float": float, "str": str, "bool": bool}[name]
            try:
                return replace(known, value=converter(known.value))
            except Exception:
                return Unknown(f"{name}() of {known.value!r}")
        if name == "dict":
            result = DictValue({}, args.node, list(args.unread))
            if first is not None:
                self._merge_into(result, first, args.node.args[0])
            result.entries.update(args.keywords)
            return result
        if name in ("list", "tuple") and isinstance(first, ListValue):
            return ListValue(list(first.items), args.node)
        if name in ("min", "max") and args.positional:
            values = (
                args.positional[0].items
                if len(args.positional) == 1 and isinstance(args.positional[0], ListValue)
                else args.positional
            )
            candidates = [settle(value) for value in values]
            numbers = [
                item
                for item in candidates
                if item is not None
                and isinstance(item.value, (int, float))
                and not isinstance(item.value, bool)
            ]
            if not numbers or len(numbers) != len(candidates):
                return Unknown(f"{name}() of values not known")
            choose = min if name == "min" else max
            return choose(numbers, key=lambda item: float(item.value))  # type: ignore[arg-type]
        if name == "getattr" and len(args.positional) >= 2:
            attribute = settle(args.positional[1])
            if attribute is not None and isinstance(attribute.value, str):
                owner = args.positional[0]
                found = self._attribute_of(owner, attribute.value)
                if isinstance(found, Unknown) and len(args.positional) >= 3:
                    return args.positional[2]
                return found
        if name == "vars" and isinstance(first, NamespaceObject):
            return DictValue(dict(first.attributes), args.node)
        if name == "len" and isinstance(first, Symbol) and first.name == "sys.argv":
            # read without a command line: the script's name alone
            note = "sys.argv without command-line arguments"
            return Known(1, args.node, Provenance.CLI_DEFAULT, note)
        if name == "len" and isinstance(first, ListValue):
            return Known(len(first.items), args.node)
        if name == "range":
            return counted_range(args)
        if name == "setattr" and len(args.positional) == 3:
            target, name_value, assigned = args.positional
            named = settle(name_value)
            if named is not None and isinstance(named.value, str):
                self.set_attribute(target, named.value, assigned)
            else:  # any field may be this one
                forget_fields(
                    target,
                    f"may be set by `setattr`{self._at(args.node)} by a name "
                    "not known before run time",
                )
            return Known(None, args.node)
        return None

    def _attribute_of(self, owner: Value, name: str) -> Value:
        if isinstance(owner, Symbol):
            return Symbol(f"{owner.name}.{name}", owner.node)
        if isinstance(owner, NamespaceObject):
            return owner.attributes.get(name, Unknown(f"no argument {name}"))
        if isinstance(owner, (DataclassInstance, ConfigObject)):
            return owner.fields.get(name, Unknown(name))
        return Unknown(name)

    def call_method(self, owner: Value, method: str, args: CallArgs) -> Value:
        if isinstance(owner, Unknown):
            return Unknown(owner.reason)
        if isinstance(owner, ModelObject):
            return model_method(owner, method, args)
        if isinstance(owner, TokenizerObject):
            return tokenizer_method(self, method, args)
        if isinstance(owner, DictValue):
            return self.dict_method(owner, method, args)
        if isinstance(owner, ArgParserObject):
            return argparse_method(self, owner, method, args)
        if isinstance(owner, ArgumentsParserObject):
            return dataclass_parser_method(self, owner, method, args)
        if isinstance(owner, ListValue) and method == "copy":
            return ListValue(list(owner.items), args.node)
        if isinstance(owner, FunctionValue) and method in ("__call__",):
            return self.call_function(owner, args, args.node)
        return Unknown(f"the result of .{method}()")

    def dict_method(self, owner: DictValue, method: str, args: CallArgs) -> Value:
        if method == "update":
            for positional, node in zip(args.positional, args.node.args, strict=False):
                self._merge_into(owner, positional, node)
            owner.entries.update(args.keywords)
            return Known(None, args.node)
        if method in ("get", "pop"):
            key = settle(args.positional[0]) if args.positional else None
            if key is not None and isinstance(key.value, str):
                if key.value in owner.entries:
                    found = owner.entries[key.value]
                    if method == "pop":
                        del owner.entries[key.value]
                    return found
                if len(args.positional) > 1:
                    return args.positional[1]
                return Known(None, args.node)
            return Unknown("a key not known")
        if method == "setdefault":
            key = settle(args.positional[0]) if args.positional else None
            if key is not None and isinstance(key.value, str):
                default = args.positional[1] if len(args.positional) > 1 else Known(None, None)
                return owner.entries.setdefault(key.value, default)
        if method == "copy":
            return DictValue(dict(owner.entries), args.node, list(owner.unread))
        if method in ("items", "keys", "values") and not owner.unread:
            keys: list[Value] = [Known(key, owner.node) for key in owner.entries]
            values: list[Value] = list(owner.entries.values())
            if method == "items":
                pairs: list[Value] = [
                    ListValue([key, value], owner.node)
                    for key, value in zip(keys, values, strict=True)
                ]
                return ListValue(pairs, args.node)
            return ListValue(keys if method == "keys" else values, args.node)
        return Unknown(f"dict.{method}()")


def _as_load(target: ast.expr) -> ast.expr:
    """The target of `x += 1` read as an expression."""
    if isinstance(target, ast.Name):
        return ast.copy_location(ast.Name(id=target.id, ctx=ast.Load()), target)
    return target


def _gives_up(body: list[ast.stmt]) -> bool:
    """A block that ends the run or the function without a result."""
    return _terminates(body) or _returns_nothing(body)


def _argv_index(node: ast.expr) -> int | None:
    """N for the expression `sys.argv[N]`."""
    if (
        isinstance(node, ast.Subscript)
        and _dotted_name(node.value) == "sys.argv"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    ):
        return node.slice.value
    return None
