"""The language server end to end: a real client (VS Code's and Neovim's capabilities) over stdio.

Expected numbers are never copied from the server: they come from the analyzer run in this
process on the same text (`check_text`), or from what the server itself promised (a fix title).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lsp_helpers import (
    FITTING_LORA,
    NOT_FITTING,
    SERVER_ENV,
    apply_lsp_edits,
    open_document,
    options,
    published,
    replace_all,
    resolved,
    start,
    wait_until,
)
from lsprotocol import types
from pytest_lsp import LanguageClient

from llmmem.check import check_text
from llmmem.units import format_bytes

VSCODE = "visual_studio_code"
NEOVIM = "neovim@v0.11.0"


def latest(client: LanguageClient, uri: str) -> types.PublishDiagnosticsParams | None:
    for params in reversed(published(client)):
        if params.uri == uri:
            return params
    return None


async def diagnostics_for(client: LanguageClient, uri: str, version: int) -> list[types.Diagnostic]:
    await wait_until(lambda: (p := latest(client, uri)) is not None and p.version == version)
    found = latest(client, uri)
    assert found is not None
    return found.diagnostics


def edits_of(action: types.CodeAction, uri: str) -> list[types.TextEdit]:
    assert action.edit is not None
    if action.edit.document_changes:
        change = action.edit.document_changes[0]
        assert isinstance(change, types.TextDocumentEdit)
        assert change.text_document.uri == uri
        return [e for e in change.edits if isinstance(e, types.TextEdit)]
    assert action.edit.changes is not None
    return list(action.edit.changes[uri])


def position_of(text: str, needle: str, delta: int = 0) -> types.Position:
    index = text.index(needle) + delta
    line = text.count("\n", 0, index)
    return types.Position(line=line, character=index - (text.rfind("\n", 0, index) + 1))


# -- diagnostics ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_open_publishes_will_not_fit_with_rule_link_and_related_values(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    path = workdir / "train.py"
    uri = open_document(client, path, NOT_FITTING)
    diagnostics = await diagnostics_for(client, uri, 1)

    expected = check_text(path, NOT_FITTING, fallback_gpu="RTX-4090", hub=False)
    assert [d.code for d in diagnostics] == [f.code for f in expected.findings]
    will_not_fit = next(d for d in diagnostics if d.code == "LLM001")
    assert will_not_fit.source == "llmmem"
    assert will_not_fit.severity == types.DiagnosticSeverity.Error
    assert "Will not fit RTX-4090" in will_not_fit.message
    assert will_not_fit.code_description is not None
    assert will_not_fit.code_description.href.endswith("#llm001-will-not-fit")
    # anchored on the TrainingArguments(...) call
    assert will_not_fit.range.start.line == NOT_FITTING.splitlines().index(
        "args = TrainingArguments("
    )
    # the two values a person changes first (each related value is a line of the hover)
    related = {r.message.split(" = ")[0]: r for r in will_not_fit.related_information or []}
    assert set(related) == {"per_device_train_batch_size", "max_seq_length"}
    batch = related["per_device_train_batch_size"].location.range
    assert NOT_FITTING.splitlines()[batch.start.line].strip() == "per_device_train_batch_size=8,"


@pytest.mark.asyncio
async def test_settings_from_workspace_configuration_choose_the_gpu(
    client: LanguageClient, workdir: Path
) -> None:
    client.set_configuration({"gpu": "H200", "detectGpu": False}, section="llmmem")
    await start(client, VSCODE, init=options())
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    diagnostics = await diagnostics_for(client, uri, 1)
    assert "LLM001" not in [d.code for d in diagnostics]  # 8B full fine-tune fits 141 GB

    client.set_configuration({"gpu": "T4", "detectGpu": False}, section="llmmem")
    count = len(published(client))
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"llmmem": {"gpu": "T4"}})
    )
    await wait_until(lambda: len(published(client)) > count)
    diagnostics = (latest(client, uri) or types.PublishDiagnosticsParams(uri, [])).diagnostics
    assert any(d.code == "LLM001" and "T4" in d.message for d in diagnostics)


@pytest.mark.asyncio
async def test_severity_setting_turns_a_rule_off_and_bad_settings_are_reported(
    client: LanguageClient, workdir: Path
) -> None:
    await start(
        client,
        VSCODE,
        init=options(gpu="RTX-4090", severity={"LLM001": "off"}, worldSize="eight"),
    )
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    diagnostics = await diagnostics_for(client, uri, 1)
    assert "LLM001" not in [d.code for d in diagnostics]
    await wait_until(lambda: bool(client.messages))
    assert any("worldSize must be a positive integer" in m.message for m in client.messages)


# -- hovers ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_hover_on_a_keyword_is_short_and_the_call_has_the_breakdown(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    path = workdir / "train.py"
    uri = open_document(client, path, NOT_FITTING)
    await diagnostics_for(client, uri, 1)
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=position_of(NOT_FITTING, "per_device_train_batch_size", 3),
        )
    )
    assert hover is not None and isinstance(hover.contents, types.MarkupContent)
    assert hover.contents.kind == types.MarkupKind.Markdown
    text = hover.contents.value
    expected = check_text(path, NOT_FITTING, fallback_gpu="RTX-4090", hub=False)
    budget = expected.analysis.budget
    assert budget is not None
    lines = [line for line in text.splitlines() if line]
    # the first line is the whole step against the GPU, the second this setting's own cost
    assert lines[0].startswith(
        f"**≈ {format_bytes(budget.device_total_bytes)} of 24.0 GiB on RTX-4090**"
    )
    assert "does not fit" in lines[0]
    assert lines[1].startswith("`per_device_train_batch_size=8`: Each extra sequence")
    assert "at micro-batch 4:" in text and "at micro-batch 16:" in text
    assert "Largest micro-batch that fits RTX-4090" in text or "Not even a micro-batch" in text
    assert "| component |" not in text and len(lines) <= 6
    assert lines[-1] == "_The whole breakdown: run llmmem: Explain._"
    # the hover's range is the keyword's value
    assert (
        hover.range is not None
        and hover.range.start.line == position_of(NOT_FITTING, "per_device_train_batch_size").line
    )
    # the call is short too: the verdict, the three largest terms (units kept on their line),
    # where the whole table is; the table itself is Explain's
    on_call = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=position_of(NOT_FITTING, "args = TrainingArguments", 9),
        )
    )
    assert on_call is not None and isinstance(on_call.contents, types.MarkupContent)
    short = [line for line in on_call.contents.value.splitlines() if line]
    assert short[0] == lines[0] and len(short) == 3
    peak = budget.peak.components
    largest = sorted(
        [(c.value.replace("_", " "), t.bytes) for c, t in peak.items()]
        + [(o.value.replace("_", " "), t.bytes) for o, t in budget.overheads.items()],
        key=lambda item: -item[1],
    )[:3]
    assert short[1].startswith("At the peak (") and short[1].endswith(
        " · ".join(
            f"{name} {format_bytes(size)}".replace(" GiB", "\u00a0GiB") for name, size in largest
        )
    )
    assert "| weights |" not in on_call.contents.value
    assert short[2] == "_The whole breakdown: run llmmem: Explain (`llmmem explain FILE`)._"


@pytest.mark.asyncio
async def test_a_client_without_markdown_gets_plain_text_hovers(
    client: LanguageClient, workdir: Path
) -> None:
    capabilities = types.ClientCapabilities(
        text_document=types.TextDocumentClientCapabilities(
            hover=types.HoverClientCapabilities(content_format=[types.MarkupKind.PlainText]),
            publish_diagnostics=types.PublishDiagnosticsClientCapabilities(),
        )
    )
    await client.initialize_session(
        types.InitializeParams(
            capabilities=capabilities, initialization_options=options(gpu="RTX-4090")
        )
    )
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    await diagnostics_for(client, uri, 1)
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=position_of(NOT_FITTING, "args = TrainingArguments", 9),
        )
    )
    assert hover is not None and isinstance(hover.contents, types.MarkupContent)
    assert hover.contents.kind == types.MarkupKind.PlainText
    text = hover.contents.value
    assert text.startswith("≈ ") and "on RTX-4090" in text.splitlines()[0]
    assert "**" not in text and "`" not in text and "|---" not in text


@pytest.mark.asyncio
async def test_hover_on_the_model_id_and_on_lora_config(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "lora.py", FITTING_LORA)
    await diagnostics_for(client, uri, 1)

    model = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=position_of(FITTING_LORA, "Qwen/Qwen2.5-0.5B", 4),
        )
    )
    assert model is not None and isinstance(model.contents, types.MarkupContent)
    assert "**Qwen/Qwen2.5-0.5B**" in model.contents.value
    assert "Qwen2ForCausalLM" in model.contents.value
    assert "| attention |" in model.contents.value and "catalog" in model.contents.value

    lora = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=position_of(FITTING_LORA, "lora_alpha"),
        )
    )
    assert lora is not None and isinstance(lora.contents, types.MarkupContent)
    assert "**LoRA** r = 16" in lora.contents.value
    assert "| r = 64 |" in lora.contents.value  # what a larger rank would cost


# -- code actions ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_applying_a_fix_clears_the_diagnostic_and_gives_the_promised_peak(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE, init=options(gpu="A100-80GB"))
    path = workdir / "train.py"
    uri = open_document(client, path, NOT_FITTING)
    diagnostics = await diagnostics_for(client, uri, 1)
    will_not_fit = next(d for d in diagnostics if d.code == "LLM001")
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=will_not_fit.range,
            context=types.CodeActionContext(diagnostics=[will_not_fit]),
        )
    )
    assert actions
    titles = [a.title for a in actions if isinstance(a, types.CodeAction)]
    assert any(t.startswith("Enable gradient checkpointing → ") for t in titles)
    assert any(t.startswith("Use the 8-bit AdamW (adamw_bnb_8bit) → ") for t in titles)
    assert any(t.startswith("Silence LLM001 on this line") for t in titles)
    fitting = [
        a for a in actions if isinstance(a, types.CodeAction) and "(fits A100-80GB)" in a.title
    ]
    assert fitting, titles
    action = fitting[0]
    assert action.is_preferred
    promised = re.search(r"→ ([\d.]+ [KMGT]?i?B)", action.title)
    assert promised is not None

    fixed = apply_lsp_edits(NOT_FITTING, edits_of(await resolved(client, action), uri))
    replace_all(client, uri, fixed, version=2)
    diagnostics = await diagnostics_for(client, uri, 2)
    assert "LLM001" not in [d.code for d in diagnostics]
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert lenses and lenses[0].command is not None
    assert lenses[0].command.title.startswith(f"≈ {promised.group(1)} of 80.0 GiB on A100-80GB")
    assert lenses[1].command is not None and lenses[1].command.command == "llmmem.verify"


@pytest.mark.asyncio
async def test_silence_action_adds_the_pragma_and_the_diagnostic_goes(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    diagnostics = await diagnostics_for(client, uri, 1)
    will_not_fit = next(d for d in diagnostics if d.code == "LLM001")
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=will_not_fit.range,
            context=types.CodeActionContext(diagnostics=[will_not_fit]),
        )
    )
    silence = next(
        a for a in actions or [] if isinstance(a, types.CodeAction) and "Silence" in a.title
    )
    fixed = apply_lsp_edits(NOT_FITTING, edits_of(await resolved(client, silence), uri))
    assert "args = TrainingArguments(  # llmmem: ignore[LLM001]" in fixed
    replace_all(client, uri, fixed, version=2)
    assert "LLM001" not in [d.code for d in await diagnostics_for(client, uri, 2)]


# -- versions, broken documents, stress -----------------------------------------------------


@pytest.mark.asyncio
async def test_a_burst_of_edits_publishes_only_the_newest_version(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    await diagnostics_for(client, uri, 1)
    before = len(published(client))
    for version, batch in enumerate(range(2, 12), start=2):
        replace_all(
            client, uri, NOT_FITTING.replace("batch_size=8", f"batch_size={batch}"), version
        )
    await diagnostics_for(client, uri, 11)
    await asyncio.sleep(0.8)  # anything late would arrive by now
    versions = [p.version for p in published(client)[before:] if p.uri == uri]
    assert versions == [11]


@pytest.mark.asyncio
async def test_a_syntax_error_keeps_the_last_good_analysis(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    good = await diagnostics_for(client, uri, 1)
    broken = NOT_FITTING.replace("    bf16=True,\n", "    bf16=True,\n    optim=(\n")
    replace_all(client, uri, broken, version=2)
    await asyncio.sleep(1.0)
    assert latest(client, uri).version == 1  # type: ignore[union-attr]
    assert [d.code for d in latest(client, uri).diagnostics] == [d.code for d in good]  # type: ignore[union-attr]
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=position_of(NOT_FITTING, "per_device_train_batch_size", 3),
        )
    )
    assert hover is not None and "RTX-4090" in str(hover.contents)


@pytest.mark.asyncio
async def test_a_file_that_never_parsed_gets_a_useful_message(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "broken.py", "args = TrainingArguments(\n")
    diagnostics = await diagnostics_for(client, uri, 1)
    assert len(diagnostics) == 1  # the parse error, where the parser stopped, and nothing else
    (parse_error,) = diagnostics
    assert parse_error.code == "LLM015"
    assert parse_error.severity == types.DiagnosticSeverity.Error
    assert "'(' was never closed" in parse_error.message
    assert "cannot read the file" in parse_error.message
    assert (parse_error.range.start.line, parse_error.range.start.character) == (0, 24)
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=0, character=3),
        )
    )
    assert hover is None
    # and a binary file opened by mistake
    uri2 = open_document(client, workdir / "weights.json", "\x00\x01\x02", language="json")
    await diagnostics_for(client, uri2, 1)


@pytest.mark.asyncio
async def test_non_ascii_text_before_a_value_keeps_ranges_in_utf16(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    text = NOT_FITTING.replace(
        "    per_device_train_batch_size=8,",
        "    per_device_train_batch_size=8,  # 🚀 größer",
    ).replace('    output_dir="out",', '    output_dir="📁",')
    uri = open_document(client, workdir / "train.py", text)
    diagnostics = await diagnostics_for(client, uri, 1)
    related = next(d for d in diagnostics if d.code == "LLM001").related_information or []
    out_dir = next(
        (r for r in related if r.message.startswith("per_device_train_batch_size")), None
    )
    assert out_dir is not None
    line = text.splitlines()[out_dir.location.range.start.line]
    assert line[out_dir.location.range.start.character] == "8"


# -- code lens, inlay hints, commands -------------------------------------------------------


@pytest.mark.asyncio
async def test_neovim_pulls_diagnostics_and_gets_inlay_hints(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, NEOVIM)
    path = workdir / "train.py"
    uri = open_document(client, path, NOT_FITTING)
    report = await client.text_document_diagnostic_async(
        types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert isinstance(report, types.RelatedFullDocumentDiagnosticReport)
    assert "LLM001" in [d.code for d in report.items]
    assert not published(client)  # a pulling client is not pushed to as well

    hints = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(
                start=types.Position(line=0, character=0),
                end=types.Position(line=100, character=0),
            ),
        )
    )
    assert hints
    labels = {NOT_FITTING.splitlines()[h.position.line].strip(): h.label for h in hints}
    assert str(labels["per_device_train_batch_size=8,"]).endswith("per sample")
    assert "adamw_bnb_8bit would save" in str(labels['optim="adamw_torch",'])

    # the per-sample delta is the analyzer's own: one more sample, estimated again
    expected = check_text(path, NOT_FITTING, fallback_gpu="RTX-4090", hub=False)
    from llmmem.report.deltas import setting_deltas

    batch = next(
        d for d in setting_deltas(expected.analysis) if d.field == "per_device_train_batch_size"
    )
    assert labels["per_device_train_batch_size=8,"] == batch.label


@pytest.mark.asyncio
async def test_explain_and_gpus_commands(client: LanguageClient, workdir: Path) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "lora.py", FITTING_LORA)
    await diagnostics_for(client, uri, 1)
    report = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="llmmem.explain", arguments=[uri])
    )
    assert report["version"] == 1
    assert report["budget"]["peak_phase"]
    assert "on RTX-4090" in report["markdown"]
    gpus = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="llmmem.gpus", arguments=[])
    )
    names = {gpu["name"] for gpu in gpus}
    assert {"A100-80GB", "H100-80GB", "RTX-4090"} <= names or "RTX-4090" in names


@pytest.mark.asyncio
async def test_a_change_to_a_referenced_deepspeed_json_reanalyses_the_script(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE, init=options(gpu="A100-80GB", worldSize=8))
    ds = workdir / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 0}, "train_micro_batch_size_per_gpu": "auto"}')
    script = NOT_FITTING.replace(
        'optim="adamw_torch",', 'optim="adamw_torch",\n    deepspeed="ds.json",'
    )
    uri = open_document(client, workdir / "train.py", script)
    await diagnostics_for(client, uri, 1)

    async def total() -> int:
        report = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="llmmem.explain", arguments=[uri])
        )
        return int(report["budget"]["device_total_bytes"])

    unsharded = await total()
    count = len(published(client))
    ds.write_text('{"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}')
    client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(
            changes=[types.FileEvent(uri=ds.as_uri(), type=types.FileChangeType.Changed)]
        )
    )
    await wait_until(lambda: len(published(client)) > count)
    # the server now reads stage 3: its number is the analyzer's for the new JSON, and less
    expected = check_text(
        workdir / "train.py", script, fallback_gpu="A100-80GB", hub=False, world_size=8
    )
    assert expected.analysis.budget is not None
    sharded = await total()
    assert sharded == expected.analysis.budget.device_total_bytes
    assert sharded < unsharded


def _position(text: str, index: int) -> types.Position:
    line = text.count("\n", 0, index)
    return types.Position(line=line, character=index - (text.rfind("\n", 0, index) + 1))


def random_edit(text: str, rng: random.Random) -> tuple[int, int, str]:
    """(start, end, new text): mostly edits a user makes to settings, sometimes breaking ones."""
    roll = rng.random()
    match = re.search(r"per_device_train_batch_size=(\d*)", text)
    if roll < 0.4 and match:
        return match.start(1), match.end(1), str(rng.randint(1, 64))
    if roll < 0.6:
        line_end = [m.start() for m in re.finditer("\n", text)]
        at = rng.choice(line_end) if line_end else len(text)
        return at, at, rng.choice([" ", "  # tweak", ""])
    if roll < 0.75:
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        at = rng.choice(starts)
        return at, at, f"# note {rng.randint(0, 999)}\n"
    if roll < 0.9 and text:
        at = rng.randrange(len(text))
        return at, at, rng.choice(["(", ")", "x", ",", "=", "\n", "é"])
    at = rng.randrange(max(len(text), 1))
    return at, min(len(text), at + rng.randint(1, 3)), ""


@pytest.mark.asyncio
async def test_a_thousand_random_edits_in_bursts_leave_the_server_up_and_current(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE, init=options(gpu="A100-80GB", debounceMs=100))
    path = workdir / "train.py"
    text = NOT_FITTING
    uri = open_document(client, path, text)
    await diagnostics_for(client, uri, 1)
    rng = random.Random(20261122)
    version = 1
    for burst in range(40):
        for _ in range(25):
            start_at, end_at, new_text = random_edit(text, rng)
            version += 1
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                    content_changes=[
                        types.TextDocumentContentChangePartial(
                            range=types.Range(
                                start=_position(text, start_at), end=_position(text, end_at)
                            ),
                            text=new_text,
                        )
                    ],
                )
            )
            text = text[:start_at] + new_text + text[end_at:]
        # sometimes a pause long enough for an analysis to start mid-stream
        await asyncio.sleep(0.15 if burst % 3 == 0 else 0.01)
    assert version == 1001

    expected = check_text(path, text, fallback_gpu="A100-80GB", hub=False)
    if expected.analysis.plan.unreadable is None:
        diagnostics = await diagnostics_for(client, uri, version)
    else:
        # a broken final text keeps the last good analysis; a last edit that parses is current
        await asyncio.sleep(1.0)
        last = latest(client, uri)
        assert last is not None and last.version is not None and last.version < version
        text = NOT_FITTING.replace("batch_size=8", "batch_size=3")
        version += 1
        replace_all(client, uri, text, version)
        expected = check_text(path, text, fallback_gpu="A100-80GB", hub=False)
        diagnostics = await diagnostics_for(client, uri, version)
    assert [(d.code, d.message, d.range.start.line) for d in diagnostics] == [
        (f.code, f.message, f.range.start_line if f.range else 0) for f in expected.findings
    ]
    versions = [p.version or 0 for p in published(client) if p.uri == uri]
    assert versions == sorted(versions)  # never an older version after a newer one
    assert len(versions) < 100  # debounced: not one analysis per edit
    # still answering
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert lenses


NVIM = shutil.which("nvim")


def _nvim_can_run() -> bool:
    if NVIM is None:
        return False
    try:
        proc = subprocess.run(
            [NVIM, "--headless", "--clean", "-c", "lua assert(vim.lsp.start_client)", "-c", "qa!"],
            capture_output=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@pytest.mark.skipif(not _nvim_can_run(), reason="no Neovim with vim.lsp on this machine")
def test_headless_neovim_gets_diagnostics_and_a_hover(workdir: Path) -> None:
    script = workdir / "train.py"
    script.write_text(NOT_FITTING, encoding="utf-8")
    out = workdir / "nvim-result.json"
    env = {
        **SERVER_ENV,
        "LLMMEM_PYTHON": sys.executable,
        "LLMMEM_FILE": str(script),
        "LLMMEM_OUT": str(out),
        "HOME": str(workdir),  # no user config, no shada
    }
    assert NVIM is not None
    subprocess.run(
        [
            NVIM,
            "--headless",
            "--clean",
            "-c",
            f"luafile {Path(__file__).with_name('nvim_smoke.lua')}",
        ],
        env=env,
        timeout=180,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    result = json.loads(out.read_text())
    assert result["error"] is None
    codes = [d["code"] for d in result["diagnostics"]]
    assert "LLM001" in codes
    will_not_fit = next(d for d in result["diagnostics"] if d["code"] == "LLM001")
    assert will_not_fit["source"] == "llmmem"
    assert will_not_fit["lnum"] == NOT_FITTING.splitlines().index("args = TrainingArguments(")
    assert "of 24.0 GiB on RTX-4090" in result["hover"]


NOTEBOOK_CELLS = [
    (types.NotebookCellKind.Markup, "# Fine-tune Llama-3.1-8B"),
    (types.NotebookCellKind.Code, "!pip install -q trl peft\n%env WANDB_DISABLED=true"),
    (
        types.NotebookCellKind.Code,
        "import torch\nfrom transformers import AutoModelForCausalLM\n\n"
        'model = AutoModelForCausalLM.from_pretrained(\n    "meta-llama/Llama-3.1-8B",\n'
        "    torch_dtype=torch.bfloat16,\n)",
    ),
    (
        types.NotebookCellKind.Code,
        "from transformers import Trainer, TrainingArguments\n\n"
        "args = TrainingArguments(\n"
        '    output_dir="out",\n'
        "    per_device_train_batch_size=8,\n"
        "    bf16=True,\n"
        ")\n"
        "Trainer(model=model, args=args).train()",
    ),
]


@pytest.mark.asyncio
async def test_a_notebook_document_gets_diagnostics_and_hovers_on_its_cells(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    notebook_uri = (workdir / "finetune.ipynb").as_uri()
    cell_uris = [
        f"vscode-notebook-cell:{(workdir / 'finetune.ipynb').as_posix()}#W{index}sZmlsZQ%3D%3D"
        for index in range(len(NOTEBOOK_CELLS))
    ]
    client.notebook_document_did_open(
        types.DidOpenNotebookDocumentParams(
            notebook_document=types.NotebookDocument(
                uri=notebook_uri,
                notebook_type="jupyter-notebook",
                version=1,
                cells=[
                    types.NotebookCell(kind=kind, document=uri)
                    for (kind, _), uri in zip(NOTEBOOK_CELLS, cell_uris, strict=True)
                ],
            ),
            cell_text_documents=[
                types.TextDocumentItem(
                    uri=uri,
                    language_id="python" if kind == types.NotebookCellKind.Code else "markdown",
                    version=1,
                    text=text,
                )
                for (kind, text), uri in zip(NOTEBOOK_CELLS, cell_uris, strict=True)
            ],
        )
    )
    trainer_cell = cell_uris[3]
    await wait_until(lambda: any(p.uri == trainer_cell for p in published(client)))
    by_cell = {p.uri: p.diagnostics for p in published(client)}
    will_not_fit = next(d for d in by_cell[trainer_cell] if d.code == "LLM001")
    assert "RTX-4090" in will_not_fit.message
    assert will_not_fit.range.start.line == 2  # `args = TrainingArguments(` in its own cell
    assert not by_cell.get(cell_uris[1])  # the !pip cell has nothing to say

    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=trainer_cell),
            position=types.Position(line=4, character=10),
        )
    )
    assert hover is not None and "of 24.0 GiB on RTX-4090" in str(hover.contents)
    model_hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=cell_uris[2]),
            position=types.Position(line=4, character=10),
        )
    )
    assert model_hover is not None and "**meta-llama/Llama-3.1-8B**" in str(model_hover.contents)

    # a quick fix in the cell carries its edit to that cell; applied, the cell is re-analysed
    # and the step's total is what the title promised
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=trainer_cell),
            range=will_not_fit.range,
            context=types.CodeActionContext(diagnostics=[will_not_fit]),
        )
    )
    checkpointing = next(
        a
        for a in actions or []
        if isinstance(a, types.CodeAction) and a.title.startswith("Enable gradient checkpointing")
    )
    edits = edits_of(await resolved(client, checkpointing), trainer_cell)
    assert [e.new_text for e in edits] == ["\n    gradient_checkpointing=True,"]
    promised = re.search(r"→ ([\d.]+ [KMGT]?i?B)", checkpointing.title)
    assert promised is not None
    count = len(published(client))
    client.notebook_document_did_change(
        types.DidChangeNotebookDocumentParams(
            notebook_document=types.VersionedNotebookDocumentIdentifier(
                uri=notebook_uri, version=2
            ),
            change=types.NotebookDocumentChangeEvent(
                cells=types.NotebookDocumentCellChanges(
                    text_content=[
                        types.NotebookDocumentCellContentChanges(
                            document=types.VersionedTextDocumentIdentifier(
                                uri=trainer_cell, version=2
                            ),
                            changes=[
                                types.TextDocumentContentChangePartial(
                                    range=edit.range, text=edit.new_text
                                )
                                for edit in edits
                            ],
                        )
                    ]
                )
            ),
        )
    )
    await wait_until(lambda: any(p.uri == trainer_cell for p in published(client)[count:]))
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=trainer_cell),
            position=types.Position(line=4, character=10),
        )
    )
    assert hover is not None and f"**≈ {promised.group(1)} of" in str(hover.contents)
