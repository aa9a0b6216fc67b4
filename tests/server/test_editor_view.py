"""What a person sees in the editor, through a real LSP client: a hover that fits a hover box
(on the trainer call too), inlay hints that read as sentences, one squiggle per range on the
value that drives it, the newest local run beside the prediction, and numbers that are never
the old text's without saying so."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest
from lsp_helpers import (
    open_document,
    options,
    published,
    start,
    wait_until,
)
from lsprotocol import types
from pytest_lsp import LanguageClient

from llmmem.check import check_text
from llmmem.units import format_bytes

VSCODE = "visual_studio_code"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BREAKDOWN = "llmmem.showBreakdown"

AXOLOTL_QLORA = """\
base_model: NousResearch/Meta-Llama-3-8B
model_type: AutoModelForCausalLM
tokenizer_type: AutoTokenizer

load_in_8bit: false
load_in_4bit: true
strict: false

datasets:
  - path: mhenrichsen/alpaca_2k_test
    type: alpaca
output_dir: ./outputs/qlora-out

adapter: qlora
sequence_len: 4096
sample_packing: true
pad_to_sequence_len: true

lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true

gradient_accumulation_steps: 4
micro_batch_size: 2
num_epochs: 1
optimizer: paged_adamw_32bit
learning_rate: 0.0002

bf16: auto
gradient_checkpointing: false  # llmmem: gpu=A100-40
flash_attention: true
"""

FROM_THE_COMMAND_LINE = (
    "from transformers import AutoModelForCausalLM, TrainingArguments, Trainer\n"
    "from trl import ModelConfig, TrlParser\n"
    "\n"
    "parser = TrlParser((ModelConfig, TrainingArguments))\n"
    "model_args, training_args = parser.parse_args_and_config()\n"
    # one long statement, as scripts write it
    'model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", '
    'dtype=model_args.dtype, attn_implementation="sdpa")\n'
    "trainer = Trainer(model=model, args=training_args)\n"
)


async def diagnostics_of(client: LanguageClient, uri: str) -> list[types.Diagnostic]:
    await wait_until(lambda: any(p.uri == uri for p in published(client)), timeout=60)
    return list(next(p for p in reversed(published(client)) if p.uri == uri).diagnostics)


def on_line(text: str, where: types.Range) -> str:
    assert where.start.line == where.end.line
    return text.splitlines()[where.start.line][where.start.character : where.end.character]


def at(text: str, needle: str, offset: int = 0) -> types.Position:
    for number, line in enumerate(text.splitlines()):
        if needle in line:
            return types.Position(line=number, character=line.index(needle) + offset)
    raise AssertionError(f"{needle!r} not in the text")


async def hover_text(client: LanguageClient, uri: str, where: types.Position) -> str | None:
    hover = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=where)
    )
    if hover is None:
        return None
    assert isinstance(hover.contents, types.MarkupContent)
    return hover.contents.value


async def lens_titles(client: LanguageClient, uri: str) -> list[str]:
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    return [lens.command.title for lens in lenses or [] if lens.command]


# -- the hover that fits ---------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("example", "call", "gpu"),
    [
        ("qlora_sft.py", "SFTTrainer(", "RTX-4090"),
        ("full_finetune.py", "Trainer(", "A100-80GB"),
        ("dpo_lora.py", "DPOTrainer(", "A100-80GB"),
    ],
)
async def test_the_trainer_call_has_the_short_hover_with_a_link_to_the_breakdown(
    client: LanguageClient, workdir: Path, example: str, call: str, gpu: str
) -> None:
    await start(client, VSCODE, options(gpu=gpu, breakdownCommand=BREAKDOWN))
    text = (EXAMPLES / example).read_text(encoding="utf-8")
    path = workdir / example
    uri = open_document(client, path, text)
    await diagnostics_of(client, uri)
    shown = await hover_text(client, uri, at(text, call, 2))
    assert shown is not None, f"no hover on {call}"
    analysis = check_text(path, text, fallback_gpu=gpu, hub=False).analysis
    assert analysis.budget is not None
    lines = [line for line in shown.splitlines() if line]
    # the verdict first, the three largest terms, the link: four short lines at most
    assert lines[0].startswith(f"**≈ {format_bytes(analysis.budget.device_total_bytes)} of ")
    assert f"on {gpu}**" in lines[0] and "(band " in lines[0]
    assert lines[1].startswith("At the peak (") and lines[1].count(" · ") == 2
    assert len(lines) <= 4 and "|" not in shown
    link = lines[-1]
    assert link.startswith(f"[The whole breakdown](command:{BREAKDOWN}?")
    arguments = json.loads(unquote(link.split("?", 1)[1].split(")", 1)[0]))
    assert arguments == [uri]
    # the name of the variable, the arguments: no hover of the call's own
    assert await hover_text(client, uri, at(text, "trainer = ", 1)) is None


@pytest.mark.asyncio
async def test_a_client_that_names_no_breakdown_command_is_told_what_to_run(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    text = (EXAMPLES / "qlora_sft.py").read_text(encoding="utf-8")
    uri = open_document(client, workdir / "train.py", text)
    await diagnostics_of(client, uri)
    shown = await hover_text(client, uri, at(text, "SFTTrainer(", 1))
    assert shown is not None and "command:" not in shown
    assert (
        shown.splitlines()[-1]
        == "_The whole breakdown: run llmmem: Explain (`llmmem explain FILE`)._"
    )


# -- the breakdown page ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_breakdown_page_is_the_current_texts(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE, options(gpu="RTX-4090"))
    text = (EXAMPLES / "qlora_sft.py").read_text(encoding="utf-8")
    path = workdir / "train.py"
    uri = open_document(client, path, text)
    await diagnostics_of(client, uri)

    async def page() -> dict[str, object]:
        answer = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="llmmem.breakdown", arguments=[uri])
        )
        assert isinstance(answer, dict) and isinstance(answer.get("html"), str), answer
        return answer

    first = await page()
    budget = check_text(path, text, fallback_gpu="RTX-4090", hub=False).analysis.budget
    assert budget is not None and first["version"] == 1 and first["stale"] is False
    html = str(first["html"])
    assert "<svg" in html and "<script" not in html
    assert f"≈ {format_bytes(budget.device_total_bytes)} of 24.0 GiB on RTX-4090" in html
    # an edit: the page follows it
    edited = text.replace("per_device_train_batch_size=4", "per_device_train_batch_size=1")
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=edited)],
        )
    )
    await wait_until(lambda: any(p.uri == uri and p.version == 2 for p in published(client)))
    second = await page()
    after = check_text(path, edited, fallback_gpu="RTX-4090", hub=False).analysis.budget
    assert after is not None and second["version"] == 2
    assert f"≈ {format_bytes(after.device_total_bytes)} of 24.0 GiB" in str(second["html"])


# -- inlay hints -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_inlay_hints_stand_behind_values_the_file_writes(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE, options(gpu="A100-80GB"))
    text = (EXAMPLES / "full_finetune.py").read_text(encoding="utf-8")
    uri = open_document(client, workdir / "train.py", text)
    await diagnostics_of(client, uri)
    hints = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(
                start=types.Position(line=0, character=0),
                end=types.Position(line=len(text.splitlines()), character=0),
            ),
        )
    )
    assert hints
    lines = text.splitlines()
    shown = {lines[h.position.line][: h.position.character].strip(): str(h.label) for h in hints}
    # gradient checkpointing is not written: no hint after the call's `)` ("True would save")
    assert ")" not in shown, shown
    assert not any(label.startswith("True") for label in shown.values())
    behind = [key for key in shown if key.startswith("optim=")]
    assert behind and shown[behind[0]].startswith("adamw_bnb_8bit would save ")
    assert any(key.startswith("per_device_train_batch_size=") for key in shown)


# -- squiggles -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_yaml_config_has_one_squiggle_per_range_each_on_what_drives_it(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE, options(gpu="A100-80GB"))
    uri = open_document(client, workdir / "qlora.yml", AXOLOTL_QLORA, language="yaml")
    diagnostics = await diagnostics_of(client, uri)
    ranges = [
        (d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character)
        for d in diagnostics
    ]
    assert len(ranges) == len(set(ranges)), [(d.code, d.range) for d in diagnostics]
    texts = {d.code: on_line(AXOLOTL_QLORA, d.range) for d in diagnostics}
    # the activations on the setting that drives them, not on the model's value
    assert texts.get("LLM004") == "gradient_checkpointing: false", texts
    # the GPU named in the pragma: its name underlined, not the comment
    assert texts.get("LLM014") == "A100-40", texts
    for d in diagnostics:  # never a whole line or comment
        line = AXOLOTL_QLORA.splitlines()[d.range.start.line]
        assert on_line(AXOLOTL_QLORA, d.range) != line.strip()


@pytest.mark.asyncio
async def test_what_the_command_line_gives_is_underlined_on_its_expression(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE, options(gpu="A100-80GB"))
    text = FROM_THE_COMMAND_LINE
    uri = open_document(client, workdir / "sft.py", text)
    diagnostics = await diagnostics_of(client, uri)
    unread = [d for d in diagnostics if "could not read" in d.message]
    assert len(unread) == 1, [d.message for d in diagnostics]
    assert on_line(text, unread[0].range) == "model_args.dtype"
    # a finding on a call written on one line: its name
    spans = [on_line(text, d.range) for d in diagnostics]
    assert all(len(span) <= len("model_args.dtype") for span in spans), spans


# -- local runs ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_recorded_run_is_shown_beside_the_prediction(
    client: LanguageClient, workdir: Path
) -> None:
    text = (EXAMPLES / "qlora_sft.py").read_text(encoding="utf-8")
    script = workdir / "train.py"
    script.write_text(text, encoding="utf-8")
    log = workdir / "run.log"
    log.write_text("step 10\nmax_memory_allocated: 21.50 GiB  max_memory_reserved = 24.25 GiB\n")
    recorded = subprocess.run(
        [sys.executable, "-m", "llmmem", "calibrate", "add", str(log), "--for", str(script),
         "--gpu", "A100-80GB", "--format", "json"],
        capture_output=True, text=True, cwd=workdir, timeout=120,
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    row = json.loads(recorded.stdout)["row"]
    assert row["measured"]["reserved"] == round(24.25 * 2**30)
    expected = (
        f"measured on A100-80GB on {row['recorded'][:10]}: reserved "
        f"{format_bytes(row['measured']['reserved'])} "
        f"(predicted {format_bytes(row['predicted']['reserved'])})"
    )
    await start(client, VSCODE, options(gpu="A100-80GB"))
    uri = open_document(client, script, text)
    await diagnostics_of(client, uri)
    shown = await hover_text(client, uri, at(text, "SFTTrainer(", 1))
    assert shown is not None and expected[0].upper() + expected[1:] in shown
    titles = await lens_titles(client, uri)
    assert any(title.endswith(f" · {expected}") for title in titles), titles


# -- fresh or marked -------------------------------------------------------------------------


def long_script(helpers: int) -> str:
    text = (EXAMPLES / "qlora_sft.py").read_text(encoding="utf-8")
    filler = "\n".join(
        f"def helper_{i}(x):\n    y = x * {i} + 1\n    return y\n" for i in range(helpers)
    )
    return text.replace("trainer.train()", filler + "\n\ntrainer.train()")


def edit(
    client: LanguageClient, uri: str, version: int, *changes: tuple[int, int, int, str]
) -> None:
    """One didChange of one-line replacements (line, start, end, new text)."""
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=line, character=start),
                        end=types.Position(line=line, character=end),
                    ),
                    text=new,
                )
                for line, start, end, new in changes
            ],
        )
    )


@pytest.mark.asyncio
async def test_after_an_edit_of_a_10k_line_file_no_hover_shows_the_old_total_unmarked(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE, options(gpu="RTX-4090", analysisTimeoutSeconds=120))
    text = long_script(3_300)
    assert len(text.splitlines()) > 10_000
    path = workdir / "train.py"
    uri = open_document(client, path, text)
    await wait_until(lambda: any(p.uri == uri for p in published(client)), timeout=120)
    before = check_text(path, text, fallback_gpu="RTX-4090", hub=False).analysis.budget
    edited = text.replace("per_device_train_batch_size=4", "per_device_train_batch_size=1")
    after = check_text(path, edited, fallback_gpu="RTX-4090", hub=False).analysis.budget
    assert before is not None and after is not None
    old, new = (f"**≈ {format_bytes(b.device_total_bytes)} of" for b in (before, after))
    assert old != new
    where = at(text, "SFTTrainer(", 1)
    assert old in (await hover_text(client, uri, where) or "")

    async def hovers(seconds: float) -> list[str]:
        """The hovers asked over `seconds`: none waits on the analysis."""
        shown: list[str] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            asked = time.monotonic()
            answer = await hover_text(client, uri, where)
            assert time.monotonic() - asked < 1.2, "a hover waited on the analysis"
            assert answer is not None
            shown.append(answer)
            await asyncio.sleep(0.2)
        return shown

    # the micro-batch changed and a helper far below broken mid-typing: the text does not
    # parse, the estimate stays the last version's that did, and says so each time
    batch = at(text, "per_device_train_batch_size=4").line
    helper = at(text, "def helper_2500(x):").line
    edit(client, uri, 2, (batch, 32, 33, "1"), (helper, 17, 18, ""))
    for shown in await hovers(3.0):
        assert old in shown and shown.startswith("_⟳ Estimate of the "), shown
    titles = await lens_titles(client, uri)
    assert all("⟳ before the last edit" in t for t in titles if "GiB" in t), titles

    # the helper mended: each answer is the new total, or the old one marked while the
    # edited text is analysed; the new one comes
    edit(client, uri, 3, (helper, 17, 17, ")"))
    fresh = False
    deadline = time.monotonic() + 90
    while not fresh and time.monotonic() < deadline:
        for shown in await hovers(0.5):
            if old in shown:
                assert shown.startswith("_⟳ Estimate of the text before your last edit"), shown
            else:
                assert new in shown and "⟳" not in shown, shown
                fresh = True
    assert fresh, "the edited text's estimate never came"
    titles = await lens_titles(client, uri)
    assert any(new.strip("*") in t for t in titles) and not any("⟳" in t for t in titles), titles
