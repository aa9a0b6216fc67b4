"""What a user meets first in an editor, through a real client over stdio: the analysis's
problems on the text they are about, squiggles on one name or setting rather than a whole call,
and a server that answers every request (malformed ones with an error)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lsp_helpers import (
    NOT_FITTING,
    RawClient,
    apply_lsp_edits,
    open_document,
    options,
    published,
    resolved,
    start,
    wait_until,
)
from lsprotocol import types
from pytest_lsp import LanguageClient

VSCODE = "visual_studio_code"

QLORA_SFT = Path(__file__).resolve().parents[2] / "examples" / "qlora_sft.py"

GUESSED_MODEL = """from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("acme/SuperLlama-7B")
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2)
"""

BROKEN_YAML = """base_model: meta-llama/Llama-3.1-8B
micro_batch_size: 2
sequence_len: 2048
  bad: [unclosed
adapter: lora
"""


async def diagnostics_of(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    await wait_until(lambda: any(p.uri == uri for p in published(client)))
    return list(next(p for p in reversed(published(client)) if p.uri == uri).diagnostics)


def on_line(text: str, where: types.Range) -> str:
    """The text a one-line range covers (ASCII texts: columns are characters)."""
    assert where.start.line == where.end.line
    return text.splitlines()[where.start.line][where.start.character : where.end.character]


async def lens_titles(client: LanguageClient, uri: str) -> list[str]:
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    return [lens.command.title for lens in lenses or [] if lens.command]


# -- analysis problems on the text ----------------------------------------------------------


@pytest.mark.asyncio
async def test_a_gpu_typo_in_the_pragma_is_an_error_on_the_pragma_naming_close_matches(
    client: LanguageClient, workdir: Path
) -> None:
    """LLM014, as llmmem-lint reports it, once (not also as an analysis problem)."""
    await start(client, VSCODE, options())
    text = "# llmmem: gpu=A100-80B\n" + NOT_FITTING
    uri = open_document(client, workdir / "train.py", text)
    diagnostics = await diagnostics_of(client, uri)
    gpu = [d for d in diagnostics if "A100-80B" in d.message]
    assert len(gpu) == 1, [d.message for d in diagnostics]
    assert gpu[0].severity == types.DiagnosticSeverity.Error
    assert gpu[0].code == "LLM014"
    assert gpu[0].range.start.line == 0
    assert on_line(text, gpu[0].range) == "A100-80B"  # the name, not the whole comment
    assert "A100-80GB" in gpu[0].message  # the close match
    # no fit check without a GPU: the lens says why
    assert any("unknown GPU 'A100-80B'" in title for title in await lens_titles(client, uri))
    # "did you mean": a quick fix per close match, writing it in the pragma
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=gpu[0].range,
            context=types.CodeActionContext(diagnostics=gpu, only=[types.CodeActionKind.QuickFix]),
        )
    )
    renames = [a for a in actions or [] if isinstance(a, types.CodeAction) and "gpu=" in a.title]
    assert "Use gpu=A100-80GB" in [a.title for a in renames]
    chosen = await resolved(client, next(a for a in renames if a.title == "Use gpu=A100-80GB"))
    assert chosen.edit is not None and chosen.edit.document_changes
    (change,) = chosen.edit.document_changes
    assert isinstance(change, types.TextDocumentEdit)
    edits = [e for e in change.edits if isinstance(e, types.TextEdit)]
    assert apply_lsp_edits(text, edits).startswith("# llmmem: gpu=A100-80GB\n")


@pytest.mark.asyncio
async def test_a_gpu_typo_in_the_settings_is_said_at_the_top_and_in_a_message(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE, options(gpu="A10O-80GB"))
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    diagnostics = await diagnostics_of(client, uri)
    gpu = [d for d in diagnostics if "A10O-80GB" in d.message]
    assert len(gpu) == 1, [d.message for d in diagnostics]
    assert gpu[0].range.start == types.Position(line=0, character=0)
    assert "llmmem.gpu setting" in gpu[0].message and "A100-80GB" in gpu[0].message
    # what an editor needs to offer the close matches as fixes writing its setting
    assert isinstance(gpu[0].data, dict) and gpu[0].data["setting"] == "llmmem.gpu"
    assert gpu[0].data["gpu"] == "A10O-80GB" and "A100-80GB" in gpu[0].data["suggestions"]
    await wait_until(lambda: any("A10O-80GB" in m.message for m in client.messages))
    shown = next(m for m in client.messages if "A10O-80GB" in m.message)
    assert shown.type == types.MessageType.Warning and "A100-80GB" in shown.message


@pytest.mark.asyncio
async def test_a_model_sized_from_its_name_says_so_on_the_model_id(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "train.py", GUESSED_MODEL)
    diagnostics = await diagnostics_of(client, uri)
    guess = [d for d in diagnostics if "guess" in d.message]
    assert len(guess) == 1, [d.message for d in diagnostics]
    # one squiggle on the model id: LLM017's range (a warning) and the guess, said together
    assert guess[0].severity == types.DiagnosticSeverity.Warning and guess[0].code == "LLM017"
    assert on_line(GUESSED_MODEL, guess[0].range) == '"acme/SuperLlama-7B"'
    assert "model_config=" in guess[0].message
    assert len([d for d in diagnostics if d.range == guess[0].range]) == 1
    # the code lens and Explain (which the status bar reads) say the same
    (total, _) = await lens_titles(client, uri)
    assert total.endswith("· model shapes guessed from its name"), total
    report = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="llmmem.explain", arguments=[uri])
    )
    assert report is not None
    assert any(line in guess[0].message.splitlines() for line in report["problems"])


@pytest.mark.asyncio
async def test_a_yaml_file_read_up_to_a_bad_line_says_so_on_that_line(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "sft.yaml", BROKEN_YAML, language="yaml")
    diagnostics = await diagnostics_of(client, uri)
    partial = [d for d in diagnostics if "kept the 3 line(s) above it" in d.message]
    assert len(partial) == 1, [d.message for d in diagnostics]
    assert partial[0].range.start.line == 3
    assert on_line(BROKEN_YAML, partial[0].range).startswith("bad")
    assert not partial[0].message.startswith("line ")  # the range says where


@pytest.mark.asyncio
async def test_a_gpu_typo_in_pyproject_gets_a_fix_per_close_match_in_pyproject(
    client: LanguageClient, workdir: Path
) -> None:
    """[tool.llmmem] gpu names no GPU: LLM014 on the script says where, and each close match
    is a quick fix that edits pyproject.toml; saved, the fit check is back."""
    pyproject = workdir / "pyproject.toml"
    project = '[project]\nname = "sft"\n\n[tool.llmmem]\ngpu = "A10O-80GB"\n'
    pyproject.write_text(project, encoding="utf-8")
    await start(client, VSCODE, options())
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    diagnostics = await diagnostics_of(client, uri)
    gpu = [d for d in diagnostics if d.code == "LLM014"]
    assert len(gpu) == 1 and "pyproject.toml, line 5" in gpu[0].message, gpu
    answer = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=gpu[0].range,
            context=types.CodeActionContext(diagnostics=gpu, only=[types.CodeActionKind.QuickFix]),
        )
    )
    by_title = {a.title: a for a in answer or [] if isinstance(a, types.CodeAction)}
    wanted = 'Use gpu = "A100-80GB" in pyproject.toml'
    assert wanted in by_title, list(by_title)
    made = await resolved(client, by_title[wanted])
    assert made.edit is not None and made.edit.document_changes
    (change,) = made.edit.document_changes
    assert isinstance(change, types.TextDocumentEdit)
    assert change.text_document.uri == pyproject.as_uri()
    edits = [e for e in change.edits if isinstance(e, types.TextEdit)]
    fixed = apply_lsp_edits(project, edits)
    assert fixed == project.replace("A10O-80GB", "A100-80GB")

    # saved: the script is checked against the A100 again
    pyproject.write_text(fixed, encoding="utf-8")
    count = len(published(client))
    client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(
            changes=[types.FileEvent(uri=pyproject.as_uri(), type=types.FileChangeType.Changed)]
        )
    )
    await wait_until(lambda: any(p.uri == uri for p in published(client)[count:]))
    after = next(p for p in reversed(published(client)) if p.uri == uri).diagnostics
    assert not [d for d in after if d.code == "LLM014"]
    assert any("A100-80GB" in title for title in await lens_titles(client, uri))


MISSING_DEEPSPEED = """from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=2,
    deepspeed="ds_zero3.json",
)
"""


@pytest.mark.asyncio
async def test_a_referenced_config_that_is_missing_says_so_on_the_line_naming_it(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "train.py", MISSING_DEEPSPEED)
    diagnostics = await diagnostics_of(client, uri)
    missing = [d for d in diagnostics if "ds_zero3.json" in d.message]
    assert len(missing) == 1, [d.message for d in diagnostics]
    assert on_line(MISSING_DEEPSPEED, missing[0].range) == "ds_zero3.json"  # the value
    assert "could not be read" in missing[0].message
    # Explain (the status bar's tooltip) has it too
    report = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="llmmem.explain", arguments=[uri])
    )
    assert report is not None
    assert any("ds_zero3.json" in line for line in report["problems"])


# -- narrow squiggles -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_findings_underline_the_call_name_or_the_setting_not_the_whole_call(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    text = QLORA_SFT.read_text(encoding="utf-8")
    uri = open_document(client, workdir / "qlora_sft.py", text)
    diagnostics = await diagnostics_of(client, uri)
    by_code = {d.code: d for d in diagnostics if d.code}
    assert {"LLM001", "LLM003"} <= set(by_code)
    # the step does not fit: on the configuration's name, with the two values a person
    # changes first as its related information (each is a line of the hover)
    will_not_fit = by_code["LLM001"]
    assert on_line(text, will_not_fit.range) == "SFTConfig"
    related = {r.message.split(" = ")[0] for r in will_not_fit.related_information or []}
    assert related == {"per_device_train_batch_size", "max_seq_length"}
    # the logits: on the sequence length that drives them
    assert on_line(text, by_code["LLM003"].range) == "max_length=2048"

    # the hover on the call's other lines: the step's short hover
    call_line = will_not_fit.range.start.line + 1
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=call_line, character=4),
        )
    )
    assert hover is not None and isinstance(hover.contents, types.MarkupContent)
    assert "At the peak (" in hover.contents.value


@pytest.mark.asyncio
async def test_activations_underline_the_micro_batch_when_checkpointing_is_not_written(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    diagnostics = await diagnostics_of(client, uri)
    activations = next(d for d in diagnostics if d.code == "LLM004")
    assert on_line(NOT_FITTING, activations.range) == "per_device_train_batch_size=8"
    will_not_fit = next(d for d in diagnostics if d.code == "LLM001")
    assert on_line(NOT_FITTING, will_not_fit.range) == "TrainingArguments"


# -- a server that answers every request ----------------------------------------------------


@pytest.fixture
def raw() -> Iterator[RawClient]:
    client = RawClient()
    yield client
    client.close()


def test_malformed_requests_get_invalid_params(raw: RawClient, workdir: Path) -> None:
    raw.initialize()
    uri = (workdir / "train.py").as_uri()
    document = {"uri": uri, "languageId": "python", "version": 1, "text": NOT_FITTING}
    raw.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})
    here = {"textDocument": {"uri": uri}}
    malformed = [
        ("textDocument/hover", here),  # no position
        ("textDocument/hover", {**here, "position": {"line": -1, "character": 0}}),
        ("textDocument/codeAction", {**here, "context": {"diagnostics": []}}),  # no range
        ("textDocument/inlayHint", here),  # no range
        ("workspace/executeCommand", {"arguments": [uri]}),  # no command
        ("textDocument/hover", None),  # no params at all
    ]
    for ident, (method, params) in enumerate(malformed, start=10):
        answer = raw.request(ident, method, params, timeout=1.0)
        assert answer is not None, f"no answer within 1 s to {method} {params}"
        assert answer["error"]["code"] == types.ErrorCodes.InvalidParams, answer
    # the server is still up and answers a well-formed request
    position = {"line": 8, "character": 4}
    good = raw.request(30, "textDocument/hover", {**here, "position": position}, timeout=30)
    assert good is not None and "error" not in good


def test_an_unknown_command_is_an_error_without_a_traceback(raw: RawClient) -> None:
    raw.initialize()
    answer = raw.request(2, "workspace/executeCommand", {"command": "llmmem.nope"}, timeout=1.0)
    assert answer is not None, "no answer within 1 s"
    assert answer["error"]["code"] == types.ErrorCodes.InvalidParams
    assert "llmmem.explain" in answer["error"]["message"]  # says which commands exist
    assert raw.request(3, "shutdown") is not None
    raw.send({"method": "exit"})
    assert raw.process.wait(timeout=10) == 0
    log = raw.close()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_after_shutdown_requests_are_refused_and_exit_says_how_it_ended(raw: RawClient) -> None:
    raw.initialize()
    assert raw.request(2, "shutdown") is not None
    refused = raw.request(3, "workspace/executeCommand", {"command": "llmmem.gpus"}, timeout=1.0)
    assert refused is not None and refused["error"]["code"] == types.ErrorCodes.InvalidRequest
    raw.send({"method": "exit"})
    assert raw.process.wait(timeout=10) == 0

    unclean = RawClient()
    try:
        unclean.initialize()
        unclean.send({"method": "exit"})  # no shutdown first
        assert unclean.process.wait(timeout=10) == 1
    finally:
        unclean.close()


def test_a_server_started_in_the_workspace_imports_nothing_from_it(tmp_path: Path) -> None:
    """An editor may start `python -m llmmem_lsp` with the workspace as its working directory:
    a `yaml.py` there (the YAML reader's module name) is not imported when a YAML file is
    analysed, and the file still gets its findings from the real YAML reader."""
    marker = tmp_path / "yaml-imported"
    (tmp_path / "yaml.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit(99)\n", encoding="utf-8"
    )
    configs = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
    config = "# llmmem: gpu=T4\n" + (configs / "trl_sft.yaml").read_text(encoding="utf-8")
    client = RawClient(cwd=tmp_path)
    try:
        client.initialize()
        uri = (tmp_path / "sft.yaml").as_uri()
        client.send(
            {
                "method": "textDocument/didOpen",
                "params": {
                    "textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": config}
                },
            }
        )
        published = client.notification("textDocument/publishDiagnostics", timeout=60)
        assert published is not None
        assert published["params"]["uri"] == uri
        assert any(d.get("code") for d in published["params"]["diagnostics"])
        assert client.request(2, "shutdown", timeout=10) is not None
        client.send({"method": "exit"})
        assert client.process.wait(timeout=10) == 0
    finally:
        client.close()
    assert not marker.exists()


@pytest.mark.asyncio
async def test_the_lens_and_llm001_give_the_error_band(
    client: LanguageClient, workdir: Path
) -> None:
    from llmmem.budget.bands import band_range, format_with_band
    from llmmem.check import check_text

    await start(client, VSCODE)  # RTX-4090
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    diagnostics = await diagnostics_of(client, uri)
    budget = check_text(workdir / "train.py", NOT_FITTING, gpu="RTX-4090", hub=False)
    budget = budget.analysis.budget
    assert budget is not None
    # LLM001: "about 128 GiB (122–148) of 24.0 GiB"
    will_not_fit = next(d for d in diagnostics if d.code == "LLM001")
    total = format_with_band(budget.device_total_bytes, budget.band)
    assert f"about {total} of 24.0 GiB" in will_not_fit.message, will_not_fit.message
    # the lens: the estimate against the GPU, then the band
    ends, unit = band_range(budget.device_total_bytes, budget.band)
    (title, _) = await lens_titles(client, uri)
    assert f"on RTX-4090 (band {ends} {unit})" in title and "does not fit" in title, title
