"""Code actions through a real client: which actions a request gets (`context.diagnostics`,
`context.only`, no duplicates), and `source.fixAll.llmmem` made by `codeAction/resolve`.

Expected texts and numbers come from outside the server: `llmmem-lint --fix` run as a command
on a copy of the same file, and the analyzer run in this process on the edited text.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lsp_helpers import (
    NOT_FITTING,
    SERVER_ENV,
    apply_lsp_edits,
    open_document,
    options,
    published,
    resolved,
    wait_until,
)
from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities

from llmmem.check import check_text

FIX_ALL = "source.fixAll.llmmem"


async def begin(client: LanguageClient, gpu: str = "A100-80GB") -> types.InitializeResult:
    return await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual_studio_code"),
            initialization_options=options(gpu=gpu),
        )
    )


async def open_and_wait(
    client: LanguageClient, path: Path, text: str
) -> tuple[str, list[types.Diagnostic]]:
    uri = open_document(client, path, text)
    await wait_until(lambda: any(p.uri == uri and p.version == 1 for p in published(client)))
    diagnostics = next(p for p in published(client) if p.uri == uri).diagnostics
    return uri, list(diagnostics)


async def ask(
    client: LanguageClient,
    uri: str,
    diagnostics: list[types.Diagnostic],
    only: list[str] | None = None,
    where: types.Range | None = None,
) -> list[types.CodeAction]:
    start = types.Position(line=0, character=0)
    answer = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=where or (diagnostics[0].range if diagnostics else types.Range(start, start)),
            context=types.CodeActionContext(diagnostics=diagnostics, only=only),
        )
    )
    return [a for a in answer or [] if isinstance(a, types.CodeAction)]


def apply_edit(text: str, edit: types.WorkspaceEdit | None, uri: str) -> str:
    """The client's side of a workspace edit (ASCII texts: columns are characters)."""
    assert edit is not None
    if edit.document_changes:
        (change,) = edit.document_changes
        assert isinstance(change, types.TextDocumentEdit) and change.text_document.uri == uri
        edits = [e for e in change.edits if isinstance(e, types.TextEdit)]
    else:
        assert edit.changes is not None
        edits = list(edit.changes[uri])
    return apply_lsp_edits(text, edits)


@pytest.mark.asyncio
async def test_only_the_named_diagnostics_get_actions(
    client: LanguageClient, workdir: Path
) -> None:
    await begin(client)
    uri, diagnostics = await open_and_wait(client, workdir / "train.py", NOT_FITTING)
    codes = [d.code for d in diagnostics]
    # the 8B full fine-tune is over 80 GiB (LLM001, on the trainer call's name) and activations
    # dominate (LLM004, on the micro-batch keyword of that call)
    assert "LLM001" in codes and "LLM004" in codes
    activations = next(d for d in diagnostics if d.code == "LLM004")
    will_not_fit = next(d for d in diagnostics if d.code == "LLM001")
    assert will_not_fit.range.start.line < activations.range.start.line

    actions = await ask(client, uri, [activations], only=[types.CodeActionKind.QuickFix])
    assert actions
    for action in actions:
        assert [d.code for d in action.diagnostics or []] == ["LLM004"], action.title
    titles = [a.title for a in actions]
    assert not any("LLM001" in t for t in titles)
    # an 8-bit optimizer does nothing for activations: it answers LLM001 only
    assert not any("8-bit AdamW" in t for t in titles)

    # a client that names no diagnostic gets those over the range, each fix once
    over_call = await ask(
        client,
        uri,
        [],
        only=[types.CodeActionKind.QuickFix],
        where=types.Range(start=will_not_fit.range.start, end=activations.range.end),
    )
    assert {d.code for a in over_call for d in a.diagnostics or []} >= {"LLM001", "LLM004"}
    assert len({a.title for a in over_call}) == len(over_call)
    # and a range away from every diagnostic gets none
    first_line = types.Range(
        start=types.Position(line=0, character=0), end=types.Position(line=0, character=1)
    )
    assert await ask(client, uri, [], only=[types.CodeActionKind.QuickFix], where=first_line) == []


@pytest.mark.asyncio
async def test_a_fix_answering_two_diagnostics_is_listed_once(
    client: LanguageClient, workdir: Path
) -> None:
    await begin(client)
    uri, diagnostics = await open_and_wait(client, workdir / "train.py", NOT_FITTING)
    actions = await ask(client, uri, diagnostics, only=[types.CodeActionKind.QuickFix])
    titles = [a.title for a in actions]
    assert len(titles) == len(set(titles)), titles
    checkpointing = [a for a in actions if a.title.startswith("Enable gradient checkpointing")]
    assert len(checkpointing) == 1
    assert {d.code for d in checkpointing[0].diagnostics or []} == {"LLM001", "LLM004"}


@pytest.mark.asyncio
async def test_context_only_picks_quick_fixes_or_source_actions(
    client: LanguageClient, workdir: Path
) -> None:
    result = await begin(client)
    provider = result.capabilities.code_action_provider
    assert isinstance(provider, types.CodeActionOptions)
    assert provider.resolve_provider is True
    assert FIX_ALL in (provider.code_action_kinds or [])

    uri, diagnostics = await open_and_wait(client, workdir / "train.py", NOT_FITTING)
    quick = await ask(client, uri, diagnostics, only=[types.CodeActionKind.QuickFix])
    assert quick and {a.kind for a in quick} == {types.CodeActionKind.QuickFix}
    for only in (["source"], ["source.fixAll"], [FIX_ALL]):
        source = await ask(client, uri, diagnostics, only=only)
        assert [a.kind for a in source] == [FIX_ALL], only
    assert await ask(client, uri, diagnostics, only=["refactor"]) == []
    everything = await ask(client, uri, diagnostics)
    assert {a.kind for a in everything} == {types.CodeActionKind.QuickFix, FIX_ALL}


@pytest.mark.asyncio
async def test_fix_all_is_resolved_to_what_llmmem_lint_fix_writes(
    client: LanguageClient, workdir: Path
) -> None:
    await begin(client)
    uri, diagnostics = await open_and_wait(client, workdir / "train.py", NOT_FITTING)
    (fix_all,) = await ask(client, uri, diagnostics, only=["source.fixAll"])
    assert fix_all.edit is None  # made only when chosen
    made = await client.code_action_resolve_async(fix_all)
    fixed = apply_edit(NOT_FITTING, made.edit, uri)

    # the command line, on a copy of the same file
    copy = workdir / "cli" / "train.py"
    copy.parent.mkdir()
    copy.write_text(NOT_FITTING, encoding="utf-8")
    env = {**SERVER_ENV, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(
        [sys.executable, "-m", "llmmem", "lint", str(copy), "--gpu", "A100-80GB", "--fix"],
        env=env,
        capture_output=True,
        check=False,
    )
    expected = copy.read_text(encoding="utf-8")
    assert expected != NOT_FITTING  # the CLI found something to fix
    assert fixed == expected
    after = check_text(workdir / "train.py", fixed, gpu="A100-80GB", hub=False)
    assert after.analysis.budget is not None and after.analysis.budget.fits


@pytest.mark.asyncio
async def test_make_it_fit_applied_through_the_client_brings_the_example_under_the_gpu(
    client: LanguageClient, workdir: Path
) -> None:
    await begin(client)
    example = Path(__file__).resolve().parents[2] / "examples" / "full_finetune.py"
    text = example.read_text(encoding="utf-8")
    uri, diagnostics = await open_and_wait(client, workdir / "full_finetune.py", text)
    will_not_fit = next(d for d in diagnostics if d.code == "LLM001")
    actions = await ask(client, uri, [will_not_fit], only=[types.CodeActionKind.QuickFix])
    (fit,) = [a for a in actions if a.title.startswith("Make it fit: ")]
    assert fit.title.endswith("(fits A100-80GB)")
    promised = fit.title.rsplit("→ ", 1)[1].removesuffix(" (fits A100-80GB)")

    fixed = apply_edit(text, (await resolved(client, fit)).edit, uri)
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=fixed)],
        )
    )
    await wait_until(lambda: any(p.uri == uri and p.version == 2 for p in published(client)))
    after = next(p for p in published(client) if p.uri == uri and p.version == 2)
    assert "LLM001" not in [d.code for d in after.diagnostics]
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert lenses and lenses[0].command is not None
    assert lenses[0].command.title.startswith(f"≈ {promised} of 80.0 GiB on A100-80GB")


@pytest.mark.asyncio
async def test_quick_fixes_carry_their_edit_only_once_resolved(
    client: LanguageClient, workdir: Path
) -> None:
    """A client that resolves `edit` gets the list without edits (cheap to list) and each edit
    from `codeAction/resolve`, for the text it was listed for."""
    await begin(client)
    uri, diagnostics = await open_and_wait(client, workdir / "train.py", NOT_FITTING)
    actions = await ask(client, uri, diagnostics, only=[types.CodeActionKind.QuickFix])
    assert actions and all(a.edit is None and a.data for a in actions)
    checkpointing = next(a for a in actions if a.title.startswith("Enable gradient checkpointing"))
    made = await client.code_action_resolve_async(checkpointing)
    assert made.title == checkpointing.title
    fixed = apply_edit(NOT_FITTING, made.edit, uri)
    assert "gradient_checkpointing=True" in fixed and "gradient_checkpointing" not in NOT_FITTING
    silence = next(a for a in actions if a.title.startswith("Silence LLM001"))
    silenced = apply_edit(NOT_FITTING, (await client.code_action_resolve_async(silence)).edit, uri)
    assert "args = TrainingArguments(  # llmmem: ignore[LLM001]" in silenced

    # once the text has the fix, the action listed before it has no edit left to make
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=fixed)],
        )
    )
    await wait_until(lambda: any(p.uri == uri and p.version == 2 for p in published(client)))
    assert (await client.code_action_resolve_async(checkpointing)).edit is None


@pytest.mark.asyncio
async def test_a_client_without_resolve_gets_the_edits_up_front(
    client: LanguageClient, workdir: Path
) -> None:
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("emacs"),
            initialization_options=options(gpu="A100-80GB"),
        )
    )
    uri, diagnostics = await open_and_wait(client, workdir / "train.py", NOT_FITTING)
    actions = await ask(client, uri, diagnostics, only=[types.CodeActionKind.QuickFix])
    assert actions and all(a.edit is not None for a in actions)
    # fix-all too: such a client cannot ask for the edit later
    (fix_all,) = await ask(client, uri, diagnostics, only=["source.fixAll"])
    assert fix_all.edit is not None
    fixed = apply_edit(NOT_FITTING, fix_all.edit, uri)
    after = check_text(workdir / "train.py", fixed, gpu="A100-80GB", hub=False)
    assert fixed != NOT_FITTING
    assert after.analysis.budget is not None and after.analysis.budget.fits


GUESSED_MODEL = """from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("acme/SuperLlama-7B")
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2)
"""

# what save_pretrained writes for a Llama-2-7B-shaped model (fewer layers: not the guess)
SAVED_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def guess_of(diagnostics: list[types.Diagnostic]) -> types.Diagnostic:
    (guess,) = [d for d in diagnostics if "guess from its name" in d.message]
    return guess


@pytest.mark.asyncio
async def test_a_model_sized_from_its_name_gets_a_fix_naming_the_config_json_beside_it(
    client: LanguageClient, workdir: Path
) -> None:
    import json

    saved = workdir / "checkpoints" / "SuperLlama-7B"
    saved.mkdir(parents=True)
    (saved / "config.json").write_text(json.dumps(SAVED_CONFIG), encoding="utf-8")
    # not offered: a config.json that is no model's, one in a hidden folder, one too deep
    (workdir / "ds").mkdir()
    (workdir / "ds" / "config.json").write_text('{"train_batch_size": 8}', encoding="utf-8")
    (workdir / ".cache" / "m").mkdir(parents=True)
    (workdir / ".cache" / "m" / "config.json").write_text(json.dumps(SAVED_CONFIG))
    (workdir / "a" / "b" / "c").mkdir(parents=True)
    (workdir / "a" / "b" / "c" / "config.json").write_text(json.dumps(SAVED_CONFIG))
    await begin(client)
    uri, diagnostics = await open_and_wait(client, workdir / "train.py", GUESSED_MODEL)
    guess = guess_of(diagnostics)

    actions = await ask(client, uri, [guess], only=[types.CodeActionKind.QuickFix])
    # one squiggle on the model id says the guess and LLM017 together: its fix first, the
    # silencing of LLM017 last
    assert [a.title for a in actions] == [
        "Size the model from checkpoints/SuperLlama-7B/config.json "
        "(# llmmem: model_config=checkpoints/SuperLlama-7B/config.json)",
        "Silence LLM017 on this line (# llmmem: ignore[LLM017])",
    ]
    assert actions[0].edit is None and list(actions[0].diagnostics or []) == [guess]
    fixed = apply_edit(
        GUESSED_MODEL, (await client.code_action_resolve_async(actions[0])).edit, uri
    )
    assert fixed == "# llmmem: model_config=checkpoints/SuperLlama-7B/config.json\n" + GUESSED_MODEL

    # applied, the model is sized from that config: the guess is gone
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=fixed)],
        )
    )
    await wait_until(lambda: any(p.uri == uri and p.version == 2 for p in published(client)))
    after = next(p for p in reversed(published(client)) if p.uri == uri).diagnostics
    assert not [d for d in after if "guess" in d.message], [d.message for d in after]
    checked = check_text(workdir / "train.py", fixed, hub=False)
    assert checked.analysis.spec is not None and checked.analysis.spec.num_layers == 24
    # and the fix listed before has nothing left to add
    assert (await client.code_action_resolve_async(actions[0])).edit is None


@pytest.mark.asyncio
async def test_the_model_config_fix_goes_below_a_shebang_and_needs_a_model_config(
    client: LanguageClient, workdir: Path
) -> None:
    """A client without resolve gets the edit up front; with no model config near the file
    there is no fix to offer."""
    import json

    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("emacs"),
            initialization_options=options(gpu="A100-80GB"),
        )
    )
    text = "#!/usr/bin/env python\n" + GUESSED_MODEL
    uri, diagnostics = await open_and_wait(client, workdir / "train.py", text)
    quick: list[str] = [types.CodeActionKind.QuickFix]
    silence = "Silence LLM017 on this line (# llmmem: ignore[LLM017])"
    asked = await ask(client, uri, [guess_of(diagnostics)], only=quick)
    assert [a.title for a in asked] == [silence]

    (workdir / "config.json").write_text(json.dumps(SAVED_CONFIG), encoding="utf-8")
    action, last = await ask(client, uri, [guess_of(diagnostics)], only=quick)
    assert last.title == silence
    fixed = apply_edit(text, action.edit, uri)
    assert fixed.split("\n")[:2] == ["#!/usr/bin/env python", "# llmmem: model_config=config.json"]
