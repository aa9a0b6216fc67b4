"""How llmmem reads training files written in small public projects (the long-tail corpus).

    python bench/longtail.py [--only PATTERN] [--misses] [--json OUT]
                             [--mirror DIR] [--manifest FILE] [--cache DIR] [--timeout S] [--jobs N]

The corpus is `bench/longtail_manifest.jsonl`: one file of another project per line, labelled by
reading it (repository, path, commit, kind, framework, whether it trains, the values the file
itself states, whether it names its model, what makes it hard). The files are never committed:
they are rebuilt into the git-ignored `bench/.longtail/cache/<owner>+<name>/<path>` from git
snapshots of their repositories (`--mirror`, default `$LONGTAIL_MIRROR` or `../.mirror`, one
`<owner>+<name>/repo` git directory per repository). A file neither cache nor snapshot holds at
the labelled commit is listed as missing and left out. A row's `companions` (paths in the same
repository: the config a launcher runs) are cached beside it, as a checkout holds them, and not
analysed themselves. Each cached repository gets an empty
`.git` marker, so that llmmem stops looking for settings and lock files at its root, as it would
in a checkout; the analysis is given default project settings and never asks the hub.

Each file runs through `llmmem.check.check_text(path, text, gpu="A100-80GB", hub=False)`, the
call behind `llmmem-lint`, in a child process with a time limit, so a crash or a hang is counted,
not fatal. Printed, as Markdown tables:

- files, repositories, missing files, tracebacks (an exception out of check_text) and timeouts;
- training files answered: an estimate, or an LLM010 finding that names what is missing (the
  model it cannot size, or that no model was found);
- sized where the file names its model, and sized from a name guess (the resolved ModelSpec's
  source is `guess`: only a size read from the name, `models/resolve.py`);
- findings on files that do not train; the files that name their model and are not sized;
- field accuracy over the stated values, field by field: a value counts as found when llmmem
  gives it a source other than a framework default or its own assumption, and as correct when
  that value equals the label. Labels: a plain value (written in the file or passed literally by
  a launcher); `null` (not present: correct when llmmem claims nothing); `{"cli_default": X}` and
  `{"derived": X, "expr": ...}` (an argparse/dataclass default, or computed in the file: scored
  with the plain values, reported beside them); `"cli"` (only the command line or a file the
  corpus does not hold can say: not scored, but a value llmmem reports as written is counted);
- the misses (file, field, line, expected, got); all of them with `--misses`.

Always exits 0.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "bench" / "longtail_manifest.jsonl"
CACHE = ROOT / "bench" / ".longtail" / "cache"
DEFAULT_MIRROR = Path(os.environ.get("LONGTAIL_MIRROR", ROOT.parent / ".mirror"))
GPU = "A100-80GB"
TIMEOUT_S = 60.0
MISSES_SHOWN = 40

# canonical keys, in the order of the field table; lora.* and quantization.* are scored per key
FIELDS = [
    "model_id",
    "objective",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "gradient_checkpointing",
    "precision",
    "optim",
    "lora",
    "lora.r",
    "lora.alpha",
    "lora.dropout",
    "lora.target_modules",
    "quantization",
    "quantization.bits",
    "quantization.quant_type",
    "quantization.double_quant",
    "deepspeed",
    "fsdp",
    "world_size",
]
GROUPS = {
    "lora": ("r", "alpha", "dropout", "target_modules"),
    "quantization": ("bits", "quant_type", "double_quant"),
}
NOT_STATED = ("default", "assumed", "absent")  # sources that mean llmmem found nothing written
ALL_LINEAR = {"all", "all-linear", "all_linear"}


# ---------------------------------------------------------------------------------------------
# the manifest and the cache


def load_manifest(path: Path = MANIFEST) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                print(f"{path.name}:{number}: not JSON ({err.msg}); line skipped")
    return rows


def repo_folder(repo: str) -> str:
    return repo.replace("/", "+")


def cache_path(row: dict[str, Any], cache: Path = CACHE) -> Path:
    return cache / repo_folder(row["repo"]) / row["path"]


def snapshot_git_dir(mirror: Path, repo: str) -> Path | None:
    """The git directory of a repository's snapshot: `<mirror>/<owner>+<name>/repo`, or its
    `.git` when the snapshot is a clone with a work tree."""
    base = mirror / repo_folder(repo) / "repo"
    for candidate in (base / ".git", base):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def rebuild_cache(
    rows: list[dict[str, Any]], mirror: Path, cache: Path = CACHE
) -> dict[tuple[str, str], str]:
    """Write every manifest file missing from the cache from its snapshot, at the labelled
    commit. Returns the files that could not be had, each with the reason."""
    missing: dict[tuple[str, str], str] = {}
    for row in rows:
        marker = cache / repo_folder(row["repo"]) / ".git"
        wanted = [row["path"], *row.get("companions", [])]
        for path in wanted:
            reason = _write_from_snapshot(mirror, row["repo"], row["commit"], path, cache)
            if reason is not None:
                missing[(row["repo"], path)] = reason
        if (row["repo"], row["path"]) in missing:
            continue
        if not marker.exists():
            marker.write_text("", encoding="utf-8")
    return missing


def _write_from_snapshot(
    mirror: Path, repo: str, commit: str, path: str, cache: Path
) -> str | None:
    """One file of a repository into the cache, unless it is there; why not, else None."""
    target = cache / repo_folder(repo) / path
    if target.is_file():
        return None
    git_dir = snapshot_git_dir(mirror, repo)
    if git_dir is None:
        return f"no snapshot under {mirror}"
    shown = subprocess.run(
        ["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
        capture_output=True,
        check=False,
    )
    if shown.returncode != 0:
        reason = shown.stderr.decode("utf-8", "replace").strip().splitlines()
        return (reason or ["git show failed"])[0]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(shown.stdout)
    return None


# ---------------------------------------------------------------------------------------------
# one file, in a child process


def _plain(value: Any) -> Any:
    """A JSON-able copy of a plan value (enums by value, tuples as lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(getattr(value, "value", value))


def _got(sourced: Any, transform: Any = None) -> dict[str, Any]:
    """{"value", "source", "line"} of a Sourced value (line 1-based), or an absent one."""
    if sourced is None:
        return {"value": None, "source": "absent", "line": None}
    value = sourced.value
    if transform is not None:
        value = transform(value)
    line = sourced.range.start_line + 1 if sourced.range is not None else None
    return {"value": _plain(value), "source": sourced.source.value, "line": line}


def _precision(value: Any) -> Any:
    """fp32, fp16 or bf16: the labels name the 16-bit type, not llmmem's finer split (`-true`
    weights in that type, `-autocast` 16-bit weights under autocast)."""
    return str(value).split("-")[0] if value is not None else None


def plan_values(analysis: Any) -> dict[str, dict[str, Any]]:
    """The plan's value for each canonical key (what the reader read, before the budget's own
    adjustments)."""
    from llmmem.rules.practices import has_training_signal

    plan = analysis.plan
    got: dict[str, dict[str, Any]] = {
        "model_id": _got(plan.model_id),
        "per_device_train_batch_size": _got(plan.per_device_train_batch_size),
        "gradient_accumulation_steps": _got(plan.gradient_accumulation_steps),
        "max_seq_length": _got(plan.max_seq_length),
        "gradient_checkpointing": _got(plan.gradient_checkpointing),
        "precision": _got(plan.precision, _precision),
        "optim": _got(plan.optim),
    }
    if plan.objective is not None:
        got["objective"] = _got(plan.objective)
    else:  # None is supervised fine-tuning, as far as a training file says anything
        signal = has_training_signal(plan)
        got["objective"] = {
            "value": "sft" if signal else None,
            "source": "implied" if signal else "absent",
            "line": None,
        }
    lora = plan.lora
    got["lora"] = {
        "value": lora is not None,
        "source": "absent" if lora is None else "explicit",
        "line": lora.range.start_line + 1 if lora is not None and lora.range else None,
    }
    for key in GROUPS["lora"]:
        got[f"lora.{key}"] = _got(getattr(lora, key) if lora is not None else None)
    quant = plan.quantization
    got["quantization"] = {
        "value": quant is not None,
        "source": "absent" if quant is None else "explicit",
        "line": quant.range.start_line + 1 if quant and quant.range else None,
    }
    for key in GROUPS["quantization"]:
        got[f"quantization.{key}"] = _got(getattr(quant, key) if quant is not None else None)
    dist = plan.distributed
    got["deepspeed.stage"] = _got(dist.zero_stage)
    got["deepspeed.config"] = _got(dist.deepspeed_config)
    got["fsdp"] = _got(dist.fsdp)
    got["world_size"] = _got(dist.world_size)
    return got


LLM010_NAMES_WHAT = re.compile(r"no model found|cannot size model '[^']+'")


def analyse(path: Path) -> dict[str, Any]:
    """check_text on one cached file: the plan's values, the findings, whether it was sized."""
    from llmmem.check import check_text
    from llmmem.errors import UsageError
    from llmmem.extract import ProjectSettings
    from llmmem.lint_command import read_text

    started = time.perf_counter()
    try:
        text = read_text(path)
    except UsageError as err:  # what llmmem-lint says of a file it cannot read: not a crash
        return {"status": "unreadable", "error": str(err)}
    checked = check_text(path, text, gpu=GPU, hub=False, settings=ProjectSettings())
    analysis = checked.analysis
    spec = analysis.spec
    budget = analysis.budget
    findings: list[dict[str, Any]] = [
        {
            "code": f.code,
            "message": f.message,
            "line": f.range.start_line + 1 if f.range is not None else None,
        }
        for f in checked.findings
    ]
    return {
        "status": "ok",
        "seconds": round(time.perf_counter() - started, 3),
        "plan_kind": analysis.plan.kind,
        "plan_framework": analysis.plan.framework,
        "values": plan_values(analysis),
        "findings": findings,
        "sized": budget is not None,
        "peak_gib": round(budget.device_total_bytes / 2**30, 2) if budget is not None else None,
        "model_source": spec.source.value if spec is not None else None,
        "guess": bool(spec is not None and spec.is_guess),
        "model_error": analysis.model_error,
        "problems": list(analysis.problems)[:5],
        "answered": budget is not None
        or any(f["code"] == "LLM010" and LLM010_NAMES_WHAT.search(f["message"]) for f in findings),
    }


def _child(path: str, conn: Any) -> None:
    try:
        result = analyse(Path(path))
    except BaseException:  # noqa: BLE001 - a crash of llmmem is what this bench counts
        result = {"status": "traceback", "error": traceback.format_exc()}
    try:
        conn.send(result)
    finally:
        conn.close()


def analyse_all(paths: list[Path], timeout_s: float, jobs: int) -> dict[Path, dict[str, Any]]:
    """`analyse` for each path in its own forked process, `jobs` at a time; a child past
    `timeout_s` is killed and reported as a timeout, one that dies as a crash."""
    import llmmem.check  # noqa: F401 - imported once here, inherited by every child

    context = multiprocessing.get_context("fork")
    results: dict[Path, dict[str, Any]] = {}
    waiting = list(paths)
    running: list[tuple[Path, Any, Any, float]] = []
    while waiting or running:
        while waiting and len(running) < jobs:
            path = waiting.pop(0)
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(str(path), sender), daemon=True)
            process.start()
            sender.close()
            running.append((path, process, receiver, time.monotonic()))
        still = []
        for path, process, receiver, began in running:
            if receiver.poll(0.02):
                try:
                    results[path] = receiver.recv()
                except EOFError:
                    results[path] = {"status": "crash", "error": "the child process died"}
                process.join(5)
            elif not process.is_alive():
                results[path] = {
                    "status": "crash",
                    "error": f"the child process exited {process.exitcode}",
                }
            elif time.monotonic() - began > timeout_s:
                process.kill()
                process.join(5)
                results[path] = {"status": "timeout", "error": f"over {timeout_s:g} s"}
            else:
                still.append((path, process, receiver, began))
                continue
            receiver.close()
        running = still
    return results


# ---------------------------------------------------------------------------------------------
# scoring


@dataclass
class FieldResult:
    field: str
    label: str  # "plain", "default", "derived", "null" or "cli"
    expected: Any
    got: Any
    source: str
    line: int | None
    found: bool
    correct: bool


def label_of(value: Any) -> tuple[str, Any]:
    """The label kind of an expected value and the value to compare."""
    if value == "cli":
        return "cli", None
    if isinstance(value, dict) and "cli_default" in value:
        return ("null", None) if value["cli_default"] is None else ("default", value["cli_default"])
    if isinstance(value, dict) and "derived" in value:
        return "derived", value["derived"]
    if value is None:
        return "null", None
    return "plain", value


def _targets(value: Any) -> Any:
    if isinstance(value, str):
        if value.strip().lower() in ALL_LINEAR:
            return "all-linear"
        return sorted(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list):
        if len(value) == 1 and str(value[0]).lower() in ALL_LINEAR:
            return "all-linear"
        return sorted(str(item) for item in value)
    return value


def _path_tail(value: Any) -> str:
    return str(value).replace("\\", "/").rstrip("/").removeprefix("./")


def same(field: str, expected: Any, got: Any) -> bool:
    """Whether llmmem's value is the labelled one (lists as sets, `all`/`all-linear` alike,
    paths by their tail, numbers by value)."""
    if field == "lora.target_modules":
        return _targets(expected) == _targets(got)
    if field == "deepspeed.config":
        return got is not None and (
            _path_tail(got) == _path_tail(expected)
            or _path_tail(got).endswith("/" + _path_tail(expected))
        )
    if field == "model_id" and isinstance(got, str) and isinstance(expected, str):
        return got.rstrip("/") == expected.rstrip("/")
    if field == "fsdp":
        return got is not None and str(expected).lower() in str(got).lower()
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return float(expected) == float(got)
    if isinstance(expected, str) and isinstance(got, str):
        return expected.strip().lower() == got.strip().lower()
    return bool(expected == got)


def _result(field: str, label: str, expected: Any, got: dict[str, Any]) -> FieldResult:
    found = got.get("source") not in NOT_STATED
    if label == "null":
        correct = not found
    elif label == "cli":
        correct = False
    else:
        correct = found and same(field, expected, got.get("value"))
    return FieldResult(
        field,
        label,
        expected,
        got.get("value"),
        str(got.get("source")),
        got.get("line"),
        found,
        correct,
    )


def score(expected: dict[str, Any], values: dict[str, dict[str, Any]]) -> list[FieldResult]:
    """One FieldResult per labelled value (lora and quantization per key)."""
    out: list[FieldResult] = []
    for key, raw in expected.items():
        label, value = label_of(raw)
        if key in GROUPS:
            whole = values[key]
            present = {**whole, "source": "explicit" if whole["value"] else "absent"}
            if label in ("null", "cli"):
                out.append(_result(key, label, value, present))
                continue
            out.append(_result(key, "plain", True, present))
            for sub, sub_raw in value.items():
                sub_label, sub_value = label_of(sub_raw)
                if label == "default" and sub_label == "plain":
                    sub_label = "default"
                name = f"{key}.{sub}"
                out.append(_result(name, sub_label, sub_value, values[name]))
            continue
        if key == "deepspeed":
            if label == "null":
                stage, config = values["deepspeed.stage"], values["deepspeed.config"]
                claimed = (stage["value"] or 0) > 0 or config["value"] is not None
                got = stage if (stage["value"] or 0) > 0 else config
                out.append(
                    FieldResult(
                        "deepspeed",
                        "null",
                        None,
                        got["value"],
                        got["source"],
                        got["line"],
                        claimed,
                        not claimed,
                    )
                )
            elif label == "cli":
                out.append(_result("deepspeed", "cli", None, values["deepspeed.config"]))
            elif isinstance(value, int):
                result = _result("deepspeed.stage", label, value, values["deepspeed.stage"])
                result.field = "deepspeed"
                out.append(result)
            else:
                result = _result("deepspeed.config", label, value, values["deepspeed.config"])
                result.field = "deepspeed"
                out.append(result)
            continue
        out.append(_result(key, label, value, values[key]))
    return out


# ---------------------------------------------------------------------------------------------
# tables


def table(header: list[str], rows: list[list[Any]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    marks = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    return lines


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text.replace("|", "\\|").replace("\n", " ")


def short(text: Any, limit: int = 90) -> str:
    text = str(text).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "0/0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        metavar="PATTERN",
        help="only files whose 'repo/path' matches this regular expression",
    )
    parser.add_argument("--misses", action="store_true", help="print every miss")
    parser.add_argument("--json", metavar="OUT", help="write every file's result as JSON here")
    parser.add_argument(
        "--mirror",
        type=Path,
        default=DEFAULT_MIRROR,
        help="folder of repository snapshots (<owner>+<name>/repo)",
    )
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help="the labelled files")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the files are rebuilt")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per file")
    parser.add_argument("--jobs", type=int, default=max(1, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    try:
        return run(args)
    except Exception:  # noqa: BLE001 - a bench prints its own failure and still exits 0
        traceback.print_exc()
        return 0


def run(args: argparse.Namespace) -> int:
    rows = load_manifest(args.manifest)
    if args.only:
        pattern = re.compile(args.only)
        rows = [row for row in rows if pattern.search(f"{row['repo']}/{row['path']}")]
    missing = rebuild_cache(rows, args.mirror, args.cache)
    present = [row for row in rows if (row["repo"], row["path"]) not in missing]
    paths = [cache_path(row, args.cache) for row in present]
    results = analyse_all(paths, args.timeout, max(1, args.jobs))
    records = []
    for row, path in zip(present, paths, strict=True):
        result = results[path]
        fields = score(row["expected"], result["values"]) if result["status"] == "ok" else []
        records.append({"row": row, "result": result, "fields": fields})
    report(rows, missing, records, args.misses)
    if args.json:
        write_json(Path(args.json), missing, records)
    return 0


def report(
    rows: list[dict[str, Any]],
    missing: dict[tuple[str, str], str],
    records: list[dict[str, Any]],
    all_misses: bool,
) -> None:
    ok = [r for r in records if r["result"]["status"] == "ok"]
    failed = [r for r in records if r["result"]["status"] != "ok"]
    training = [r for r in ok if r["row"]["trains"]]
    not_training = [r for r in ok if not r["row"]["trains"]]
    named = [r for r in training if r["row"]["names_model"]]
    print("# llmmem on the long-tail corpus\n")
    summary = [
        ["files in the manifest", len(rows)],
        ["repositories", len({row["repo"] for row in rows})],
        ["missing (not cached, no snapshot at the commit)", len(missing)],
        ["analysed", len(records)],
        ["tracebacks", sum(r["result"]["status"] in ("traceback", "crash") for r in records)],
        ["timeouts", sum(r["result"]["status"] == "timeout" for r in records)],
        [
            "unreadable (as llmmem-lint says)",
            sum(r["result"]["status"] == "unreadable" for r in records),
        ],
        [
            "training files answered (estimate or LLM010 naming what is missing)",
            pct(sum(r["result"]["answered"] for r in training), len(training)),
        ],
        [
            "training files with an estimate",
            pct(sum(r["result"]["sized"] for r in training), len(training)),
        ],
        [
            "sized where the file names its model",
            pct(sum(r["result"]["sized"] for r in named), len(named)),
        ],
        [
            "sized by a name guess",
            pct(
                sum(r["result"]["guess"] for r in ok if r["result"]["sized"]),
                sum(r["result"]["sized"] for r in ok),
            ),
        ],
        [
            "files that do not train with a finding",
            pct(sum(bool(r["result"]["findings"]) for r in not_training), len(not_training)),
        ],
    ]
    print("\n".join(table(["measure", "value"], summary)))
    for (repo, path), reason in sorted(missing.items()):
        print(f"\nmissing: {repo}/{path}: {reason}")
    for record in failed:
        row, result = record["row"], record["result"]
        print(f"\n{result['status']}: {row['repo']}/{row['path']}")
        print("    " + "\n    ".join(str(result.get("error", "")).strip().splitlines()[-6:]))
    print("\n## By kind\n")
    print("\n".join(kind_table(ok)))
    print("\n## Field accuracy over stated values\n")
    print("\n".join(field_table(ok)))
    print("\n## Files that do not train, with findings\n")
    flagged = [r for r in not_training if r["result"]["findings"]]
    print(
        "\n".join(
            table(
                ["file", "findings"],
                [
                    [
                        f"{r['row']['repo']}/{r['row']['path']}",
                        ", ".join(
                            f"{f['code']}: {short(f['message'], 70)}"
                            for f in r["result"]["findings"]
                        ),
                    ]
                    for r in flagged
                ],
                "ll",
            )
        )
        if flagged
        else "none"
    )
    unsized = [r for r in named if not r["result"]["sized"]]
    print(f"\n## Files that name their model, not sized ({len(unsized)})\n")
    print(
        "\n".join(
            table(
                ["file", "why (model error or first problem)"],
                [
                    [
                        f"{r['row']['repo']}/{r['row']['path']}",
                        short(
                            r["result"]["model_error"]
                            or (r["result"]["problems"] or ["(none given)"])[0],
                            110,
                        ),
                    ]
                    for r in unsized
                ],
                "ll",
            )
        )
        if unsized
        else "none"
    )
    unanswered = [r for r in training if not r["result"]["answered"]]
    print(f"\n## Training files not answered ({len(unanswered)})\n")
    shown = unanswered if all_misses else unanswered[:MISSES_SHOWN]
    print(
        "\n".join(
            table(
                ["file", "why (model error or first problem)"],
                [
                    [
                        f"{r['row']['repo']}/{r['row']['path']}",
                        short(
                            r["result"]["model_error"]
                            or (r["result"]["problems"] or ["(none given)"])[0],
                            110,
                        ),
                    ]
                    for r in shown
                ],
                "ll",
            )
        )
        if shown
        else "none"
    )
    if len(shown) < len(unanswered):
        print(f"\n{len(unanswered) - len(shown)} more: run with --misses")
    misses = [(r, f) for r in ok for f in r["fields"] if f.label not in ("cli",) and not f.correct]
    print(f"\n## Misses ({len(misses)})\n")
    shown_misses = misses if all_misses else misses[:MISSES_SHOWN]
    print(
        "\n".join(
            table(
                ["file", "field", "line", "expected", "got"],
                [
                    [
                        f"{r['row']['repo']}/{r['row']['path']}",
                        f.field,
                        f.line or "",
                        short(json.dumps(f.expected, ensure_ascii=False), 50)
                        + ("" if f.label == "plain" else f" ({f.label})"),
                        short(json.dumps(f.got, ensure_ascii=False), 50) + f" [{f.source}]",
                    ]
                    for r, f in shown_misses
                ],
                "llrll",
            )
        )
        if shown_misses
        else "none"
    )
    if len(shown_misses) < len(misses):
        print(f"\n{len(misses) - len(shown_misses)} more: run with --misses")


def kind_table(ok: list[dict[str, Any]]) -> list[str]:
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for record in ok:
        counts = by_kind[record["row"]["kind"]]
        counts["files"] += 1
        if record["row"]["trains"]:
            counts["training"] += 1
            counts["answered"] += record["result"]["answered"]
            counts["sized"] += record["result"]["sized"]
        for f in record["fields"]:
            if f.label != "cli":
                counts["stated"] += 1
                counts["correct"] += f.correct
    rows = []
    for kind in ("python", "notebook", "yaml", "json", "shell"):
        c = by_kind.get(kind)
        if c:
            rows.append(
                [
                    kind,
                    c["files"],
                    c["training"],
                    c["answered"],
                    c["sized"],
                    c["stated"],
                    pct(c["correct"], c["stated"]),
                ]
            )
    return table(["kind", "files", "training", "answered", "sized", "stated", "correct"], rows)


def field_table(ok: list[dict[str, Any]]) -> list[str]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for record in ok:
        for f in record["fields"]:
            c = counts[f.field]
            if f.label == "cli":
                c["cli"] += 1
                c["cli_claimed"] += f.found
                continue
            group = "plain" if f.label in ("plain", "null") else "default"
            c[f"{group}_stated"] += 1
            c[f"{group}_correct"] += f.correct
            c["found"] += f.found and f.label != "null"
            c["unclaimed"] += (
                not f.found
                and f.label != "null"
                and f.got is not None
                and same(f.field, f.expected, f.got)
            )
    rows = []
    totals: Counter[str] = Counter()
    for name in FIELDS:
        if name not in counts:
            continue
        c = counts[name]
        totals.update(c)
        stated = c["plain_stated"] + c["default_stated"]
        correct = c["plain_correct"] + c["default_correct"]
        rows.append(
            [
                name,
                f"{c['plain_correct']}/{c['plain_stated']}",
                f"{c['default_correct']}/{c['default_stated']}",
                c["found"],
                pct(correct, stated),
                c["unclaimed"],
                f"{c['cli_claimed']}/{c['cli']}",
            ]
        )
    stated = totals["plain_stated"] + totals["default_stated"]
    correct = totals["plain_correct"] + totals["default_correct"]
    rows.append(
        [
            "total",
            f"{totals['plain_correct']}/{totals['plain_stated']}",
            f"{totals['default_correct']}/{totals['default_stated']}",
            totals["found"],
            pct(correct, stated),
            totals["unclaimed"],
            f"{totals['cli_claimed']}/{totals['cli']}",
        ]
    )
    return table(
        [
            "field",
            "plain correct",
            "in-file default/derived correct",
            "found",
            "correct",
            "right value, not claimed",
            "'cli' read as written",
        ],
        rows,
    )


def write_json(
    out: Path, missing: dict[tuple[str, str], str], records: list[dict[str, Any]]
) -> None:
    data = {
        "missing": [
            {"repo": repo, "path": path, "reason": reason}
            for (repo, path), reason in sorted(missing.items())
        ],
        "files": [
            {
                "repo": r["row"]["repo"],
                "path": r["row"]["path"],
                "kind": r["row"]["kind"],
                "trains": r["row"]["trains"],
                "names_model": r["row"]["names_model"],
                "result": r["result"],
                "fields": [vars(f) for f in r["fields"]],
            }
            for r in records
        ],
    }
    try:
        out.write_text(
            json.dumps(data, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8"
        )
    except OSError as err:
        print(f"\ncannot write {out}: {err.strerror or err}")


if __name__ == "__main__":
    sys.exit(main())
