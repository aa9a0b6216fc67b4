"""Completion and document links, as a client sees them: GPU names, pragma keys, rule codes,
optimizer and attention names where they are written; links to the DeepSpeed and model configs
a file names."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lsp_helpers import open_document, options, start
from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities

from llmmem.budget.optimizers import OPTIMIZERS
from llmmem.gpus import all_gpus
from llmmem.rules.catalog import all_rules

VSCODE = "visual_studio_code"

SCRIPT = """# llmmem: gpu=A1
# llmmem: gpu=A100-80GB ignore[LLM001, LL
# llmmem: world_size=2 gr
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B", attn_implementation="fl")
args = TrainingArguments(output_dir="out", optim="paged_", deepspeed="ds_zero3.json")
other = TrainingArguments(output_dir="out", optim=adamw_8)
"""


async def complete(
    client: LanguageClient, uri: str, line: int, character: int, trigger: str | None = None
) -> list[types.CompletionItem]:
    context = (
        types.CompletionContext(
            trigger_kind=types.CompletionTriggerKind.TriggerCharacter, trigger_character=trigger
        )
        if trigger
        else types.CompletionContext(trigger_kind=types.CompletionTriggerKind.Invoked)
    )
    result = await client.text_document_completion_async(
        types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=context,
        )
    )
    if result is None:
        return []
    return result.items if isinstance(result, types.CompletionList) else list(result)


def line_end(text: str, needle: str) -> tuple[int, int]:
    """The line holding `needle` and the column right after it."""
    for number, line in enumerate(text.split("\n")):
        if needle in line:
            return number, line.index(needle) + len(needle)
    raise AssertionError(needle)


def applied(text: str, item: types.CompletionItem) -> str:
    """The line after the client applies the item's edit."""
    edit = item.text_edit
    assert isinstance(edit, types.TextEdit)
    line = text.split("\n")[edit.range.start.line]
    return line[: edit.range.start.character] + edit.new_text + line[edit.range.end.character :]


@pytest.mark.asyncio
async def test_completion_offers_what_llmmem_knows_where_it_is_written(
    client: LanguageClient, workdir: Path
) -> None:
    result = await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(VSCODE), initialization_options=options()
        )
    )
    provider = result.capabilities.completion_provider
    assert provider is not None and "=" in (provider.trigger_characters or [])
    assert result.capabilities.document_link_provider is not None
    uri = open_document(client, workdir / "train.py", SCRIPT)

    # a GPU name after `gpu=` in a pragma, filtered by what is typed, replacing it
    line, col = line_end(SCRIPT, "gpu=A1")
    items = await complete(client, uri, line, col)
    names = [item.label for item in items]
    assert "A100-80GB" in names and "H100-80GB" not in names
    assert all(name.startswith("A1") for name in names)
    a100 = next(item for item in items if item.label == "A100-80GB")
    assert applied(SCRIPT, a100) == "# llmmem: gpu=A100-80GB"
    assert a100.detail and "80" in a100.detail
    every = await complete(client, uri, 0, len("# llmmem: gpu="), "=")
    assert [item.label for item in every] == [gpu.name for gpu in all_gpus()]

    # rule codes inside ignore[...], without those already listed
    line, col = line_end(SCRIPT, "ignore[LLM001, LL")
    codes = [item.label for item in await complete(client, uri, line, col)]
    assert "LLM001" not in codes
    assert codes == [rule.code for rule in all_rules() if rule.code != "LLM001"]
    line, col = line_end(SCRIPT, "ignore[")
    assert "LLM001" in [item.label for item in await complete(client, uri, line, col, "[")]

    # pragma keys
    line, col = line_end(SCRIPT, "world_size=2 gr")
    keys = await complete(client, uri, line, col)
    assert [item.label for item in keys] == ["grad_accum"]
    assert applied(SCRIPT, keys[0]) == "# llmmem: world_size=2 grad_accum="
    keys = await complete(client, uri, 0, len("# llmmem: "), " ")
    assert {"gpu", "seq", "batch", "model_config", "optim", "ignore"} <= {i.label for i in keys}

    # HF optim= values, from llmmem's optimizer table
    line, col = line_end(SCRIPT, 'optim="paged_')
    optims = await complete(client, uri, line, col)
    assert {item.label for item in optims} == {n for n in OPTIMIZERS if "paged_" in n}
    assert applied(SCRIPT, optims[0]).count('optim="paged_') == 1  # the prefix is replaced
    # where no quote was typed, the name comes as a string literal
    line, col = line_end(SCRIPT, "optim=adamw_8")
    bare = next(
        item for item in await complete(client, uri, line, col) if item.label == "adamw_8bit"
    )
    assert applied(SCRIPT, bare).endswith('optim="adamw_8bit")')
    # attn_implementation= values
    line, col = line_end(SCRIPT, 'attn_implementation="fl')
    attention = {item.label for item in await complete(client, uri, line, col)}
    assert {"flash_attention_2", "flex_attention"} <= attention and "sdpa" not in attention

    # nothing elsewhere
    line, col = line_end(SCRIPT, "from transformers")
    assert await complete(client, uri, line, col) == []


@pytest.mark.asyncio
async def test_completion_in_yaml_shell_and_pyproject(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    yaml_text = "base_model: Qwen/Qwen2.5-0.5B\noptimizer: adamw_\n"
    yaml_uri = open_document(client, workdir / "axolotl.yaml", yaml_text, "yaml")
    items = await complete(client, yaml_uri, 1, len("optimizer: adamw_"))
    assert "adamw_8bit" in {item.label for item in items}
    eight_bit = next(item for item in items if item.label == "adamw_8bit")
    assert applied(yaml_text, eight_bit) == "optimizer: adamw_8bit"  # YAML: no quotes

    shell = "accelerate launch train.py \\\n  --optim pag\n"
    shell_uri = open_document(client, workdir / "run.sh", shell, "shellscript")
    items = await complete(client, shell_uri, 1, len("  --optim pag"))
    assert items and all(item.label.startswith("paged_") for item in items)

    toml = '[project]\nname = "x"\n\n[tool.llmmem]\ngpu = "H1\n'
    toml_uri = open_document(client, workdir / "pyproject.toml", toml, "toml")
    items = await complete(client, toml_uri, 4, len('gpu = "H1'))
    assert "H100-80GB" in {item.label for item in items}
    assert applied(toml, next(i for i in items if i.label == "H100-80GB")) == 'gpu = "H100-80GB'
    keys = await complete(client, toml_uri, 5, 0)
    assert {"gpu", "world_size", "severity"} <= {item.label for item in keys}
    assert await complete(client, toml_uri, 1, len("name = ")) == []  # not in [tool.llmmem]

    toml = '[tool.llmmem]\nfail_on = "w\n\n[tool.llmmem.severity]\nLLM00\nLLM002 = "\n'
    toml_uri = open_document(client, workdir / "pyproject.toml", toml, "toml", version=2)
    levels = await complete(client, toml_uri, 1, len('fail_on = "w'))
    assert [item.label for item in levels] == ["warning"]
    codes = await complete(client, toml_uri, 4, len("LLM00"))
    assert [item.label for item in codes] == [r.code for r in all_rules() if "LLM00" in r.code]
    assert applied(toml, codes[0]) == 'LLM001 = "'
    severities = await complete(client, toml_uri, 5, len('LLM002 = "'))
    assert [item.label for item in severities] == ["error", "warning", "info", "hint", "off"]


@pytest.mark.asyncio
async def test_completion_answers_at_once_on_a_large_file(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    text = SCRIPT + "x = 1\n" * 10_000 + "# llmmem: gpu=H\n"
    uri = open_document(client, workdir / "big.py", text)
    last = text.count("\n") - 1
    await complete(client, uri, last, len("# llmmem: gpu=H"))  # the catalog loads once
    began = time.perf_counter()
    for _ in range(20):
        items = await complete(client, uri, last, len("# llmmem: gpu=H"))
    assert items and (time.perf_counter() - began) / 20 < 0.05


@pytest.mark.asyncio
async def test_document_links_go_to_the_configs_a_file_names(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, VSCODE)
    (workdir / "configs").mkdir()
    (workdir / "configs" / "ds_zero3.json").write_text("{}", encoding="utf-8")
    (workdir / "llama").mkdir()
    (workdir / "llama" / "config.json").write_text("{}", encoding="utf-8")
    text = (
        "# llmmem: model_config=llama/config.json gpu=H100-80GB\n"
        "# llmmem: model_config=missing/config.json\n"
        "from transformers import TrainingArguments\n"
        'args = TrainingArguments(output_dir="out", deepspeed="configs/ds_zero3.json")\n'
        'other = TrainingArguments(output_dir="out", deepspeed="configs/nothing.json")\n'
    )
    uri = open_document(client, workdir / "train.py", text)
    links = await client.text_document_document_link_async(
        types.DocumentLinkParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert links is not None
    found = {(link.range.start.line, link.target) for link in links}
    assert found == {
        (0, (workdir / "llama" / "config.json").resolve().as_uri()),
        (3, (workdir / "configs" / "ds_zero3.json").resolve().as_uri()),
    }
    link = next(link for link in links if link.range.start.line == 3)
    line = text.split("\n")[3]
    assert line[link.range.start.character : link.range.end.character] == "configs/ds_zero3.json"

    shell = "deepspeed train.py --deepspeed configs/ds_zero3.json \\\n  --bf16\n"
    shell_uri = open_document(client, workdir / "run.sh", shell, "shellscript")
    yaml_text = "base_model: Qwen/Qwen2.5-0.5B\ndeepspeed: configs/ds_zero3.json\n"
    yaml_uri = open_document(client, workdir / "axolotl.yaml", yaml_text, "yaml")
    for doc_uri, line_number in ((shell_uri, 0), (yaml_uri, 1)):
        links = await client.text_document_document_link_async(
            types.DocumentLinkParams(text_document=types.TextDocumentIdentifier(uri=doc_uri))
        )
        assert links is not None and [link.range.start.line for link in links] == [line_number]
        assert links[0].target == (workdir / "configs" / "ds_zero3.json").resolve().as_uri()
