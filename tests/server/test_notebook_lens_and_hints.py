"""A notebook's cells get what a file gets: the code lens above the trainer in its cell, inlay
hints behind the settings of a cell, the commands (Explain, Verify) with a cell's URI, and quick
fixes whose edits are made when the editor resolves them."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsp_helpers import apply_lsp_edits, published, start, wait_until
from lsprotocol import types
from pytest_lsp import LanguageClient

VSCODE = "visual_studio_code"

CELLS = [
    (types.NotebookCellKind.Markup, "# Fine-tune Llama-3.1-8B"),
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
        "    gradient_checkpointing=True,\n"
        "    bf16=True,\n"
        ")\n"
        "Trainer(model=model, args=args).train()",
    ),
]


def open_notebook(
    client: LanguageClient, workdir: Path, cells: list[tuple[types.NotebookCellKind, str]] = CELLS
) -> tuple[str, list[str]]:
    notebook = workdir / "finetune.ipynb"
    notebook.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    cell_uris = [
        f"vscode-notebook-cell:{notebook.as_posix()}#W{index}sZmlsZQ%3D%3D"
        for index in range(len(cells))
    ]
    client.notebook_document_did_open(
        types.DidOpenNotebookDocumentParams(
            notebook_document=types.NotebookDocument(
                uri=notebook.as_uri(),
                notebook_type="jupyter-notebook",
                version=1,
                cells=[
                    types.NotebookCell(kind=kind, document=uri)
                    for (kind, _), uri in zip(cells, cell_uris, strict=True)
                ],
            ),
            cell_text_documents=[
                types.TextDocumentItem(
                    uri=uri,
                    language_id="python" if kind == types.NotebookCellKind.Code else "markdown",
                    version=1,
                    text=text,
                )
                for (kind, text), uri in zip(cells, cell_uris, strict=True)
            ],
        )
    )
    return notebook.as_uri(), cell_uris


def everywhere(uri: str) -> types.Range:
    return types.Range(
        start=types.Position(line=0, character=0), end=types.Position(line=100, character=0)
    )


@pytest.mark.asyncio
async def test_code_lens_and_inlay_hints_in_notebook_cells(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    notebook_uri, cells = open_notebook(client, workdir)
    model_cell, trainer_cell = cells[1], cells[2]
    await wait_until(lambda: any(p.uri == trainer_cell for p in published(client)))

    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=trainer_cell))
    )
    assert lenses is not None and len(lenses) == 2
    total, verify = lenses
    assert total.command is not None and verify.command is not None
    assert total.range.start.line == 2  # `args = TrainingArguments(` in its cell
    assert " of 24.0 GiB on RTX-4090 " in total.command.title
    assert total.command.command == "llmmem.explain"
    assert list(total.command.arguments or []) == [trainer_cell]
    assert verify.command.title == "Verify"
    assert list(verify.command.arguments or []) == [trainer_cell]
    # the lens is in the trainer's cell only
    others = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=model_cell))
    )
    assert not others

    hints = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=trainer_cell),
            range=everywhere(trainer_cell),
        )
    )
    assert hints is not None
    labels = {hint.position.line: str(hint.label) for hint in hints}
    assert "per sample" in labels[4]  # per_device_train_batch_size=8
    assert labels[5].startswith("saves ")  # gradient_checkpointing=True
    assert hints[0].position.character == len("    per_device_train_batch_size=8")
    model_hints = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=model_cell),
            range=everywhere(model_cell),
        )
    )
    assert not model_hints

    # Explain, from the lens, with the cell's URI: the notebook's report
    report = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="llmmem.explain", arguments=[trainer_cell])
    )
    assert "error" not in report
    assert report["uri"] == trainer_cell and report["notebook"] == notebook_uri
    assert "of 24.0 GiB on RTX-4090" in report["markdown"]
    assert report["budget"] is not None
    # the notebook's own URI still works
    report = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="llmmem.explain", arguments=[notebook_uri])
    )
    assert "error" not in report and report["uri"] == notebook_uri


@pytest.mark.asyncio
async def test_completion_and_links_in_a_notebook_cell(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    (workdir / "ds_zero2.json").write_text("{}", encoding="utf-8")
    _, cells = open_notebook(client, workdir)
    trainer_cell = cells[2]
    text = CELLS[2][1].replace(
        "    bf16=True,\n", '    bf16=True,\n    deepspeed="ds_zero2.json",\n    optim="pag\n'
    )
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=trainer_cell, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )
    line = text.split("\n").index('    optim="pag')
    result = await client.text_document_completion_async(
        types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=trainer_cell),
            position=types.Position(line=line, character=len('    optim="pag')),
        )
    )
    assert isinstance(result, types.CompletionList)
    assert "paged_adamw_8bit" in {item.label for item in result.items}

    links = await client.text_document_document_link_async(
        types.DocumentLinkParams(text_document=types.TextDocumentIdentifier(uri=trainer_cell))
    )
    assert links is not None and len(links) == 1
    assert links[0].target == (workdir / "ds_zero2.json").resolve().as_uri()
    assert links[0].range.start.line == text.split("\n").index('    deepspeed="ds_zero2.json",')


@pytest.mark.asyncio
async def test_a_quick_fix_in_a_cell_gets_its_edit_when_resolved(
    client: LanguageClient, workdir: Path
) -> None:
    """As in a file: VS Code lists a cell's quick fixes without edits and resolves the one the
    user picks, for the cells' text at that moment."""
    await start(client, VSCODE)
    trainer = CELLS[2][1].replace("    gradient_checkpointing=True,\n", "")
    notebook_uri, cells = open_notebook(client, workdir, [*CELLS[:2], (CELLS[2][0], trainer)])
    trainer_cell = cells[2]
    await wait_until(
        lambda: any(p.uri == trainer_cell and p.diagnostics for p in published(client))
    )
    diagnostics = next(p for p in published(client) if p.uri == trainer_cell).diagnostics
    will_not_fit = next(d for d in diagnostics if d.code == "LLM001")
    answer = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=trainer_cell),
            range=will_not_fit.range,
            context=types.CodeActionContext(
                diagnostics=[will_not_fit], only=[types.CodeActionKind.QuickFix]
            ),
        )
    )
    actions = [a for a in answer or [] if isinstance(a, types.CodeAction)]
    assert actions and all(a.edit is None and a.data for a in actions)
    checkpointing = next(a for a in actions if a.title.startswith("Enable gradient checkpointing"))

    made = await client.code_action_resolve_async(checkpointing)
    assert made.edit is not None and made.edit.document_changes
    (change,) = made.edit.document_changes
    assert isinstance(change, types.TextDocumentEdit)
    assert change.text_document.uri == trainer_cell
    fixed = apply_lsp_edits(trainer, [e for e in change.edits if isinstance(e, types.TextEdit)])
    assert "    gradient_checkpointing=True," in fixed.split("\n")

    # with the fix in the cell, the action listed before it has nothing left to make
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
                            changes=[types.TextDocumentContentChangeWholeDocument(text=fixed)],
                        )
                    ]
                )
            ),
        )
    )
    await wait_until(lambda: any(p.uri == trainer_cell for p in published(client)[count:]))
    assert (await client.code_action_resolve_async(checkpointing)).edit is None
