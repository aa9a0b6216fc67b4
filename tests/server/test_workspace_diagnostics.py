"""`workspace/diagnostic`: the findings of the workspace's training files, open or closed, and
"unchanged" for a result id that still holds."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsp_helpers import FITTING_LORA, NOT_FITTING, SERVER_ENV, open_document, options, uri_of
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

VSCODE = "visual_studio_code"


async def pull(
    client: LanguageClient, previous: list[types.PreviousResultId] | None = None
) -> dict[str, types.WorkspaceDocumentDiagnosticReport]:
    report = await client.workspace_diagnostic_async(
        types.WorkspaceDiagnosticParams(previous_result_ids=previous or [], identifier="llmmem")
    )
    return {item.uri: item for item in report.items}


def codes(report: types.WorkspaceDocumentDiagnosticReport) -> list[str]:
    assert isinstance(report, types.WorkspaceFullDocumentDiagnosticReport)
    return [str(d.code) for d in report.items]


@pytest.mark.asyncio
async def test_workspace_diagnostics_cover_the_training_files_and_say_unchanged(
    client: LanguageClient, workdir: Path
) -> None:
    (workdir / "scripts").mkdir()
    big = workdir / "scripts" / "full_ft.py"
    big.write_text(NOT_FITTING, encoding="utf-8")
    (workdir / "lora.py").write_text(FITTING_LORA, encoding="utf-8")
    (workdir / "util.py").write_text("def helper():\n    return 1\n", encoding="utf-8")
    (workdir / "package.json").write_text('{"name": "x"}', encoding="utf-8")
    (workdir / ".hidden").mkdir()
    (workdir / ".hidden" / "copy.py").write_text(NOT_FITTING, encoding="utf-8")
    result = await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(VSCODE),
            initialization_options=options(gpu="RTX-4090"),
            workspace_folders=[types.WorkspaceFolder(uri=uri_of(workdir), name="work")],
        )
    )
    provider = result.capabilities.diagnostic_provider
    assert isinstance(provider, types.DiagnosticOptions) and provider.workspace_diagnostics

    first = await pull(client)
    # what `llmmem-lint DIR` reads, hidden folders left out; files without a model or a
    # trainer have nothing to say
    assert uri_of(workdir / ".hidden" / "copy.py") not in first
    assert "LLM001" in codes(first[uri_of(big)])
    assert "LLM001" not in codes(first[uri_of(workdir / "lora.py")])
    for quiet in ("util.py", "package.json"):
        report = first.get(uri_of(workdir / quiet))
        assert report is None or codes(report) == []
    assert all(item.version is None for item in first.values())  # all closed

    # sent back, every id still holds: "unchanged"
    previous = [
        types.PreviousResultId(uri=uri, value=item.result_id)
        for uri, item in first.items()
        if item.result_id
    ]
    second = await pull(client, previous)
    assert set(second) == set(first)
    assert all(
        isinstance(item, types.WorkspaceUnchangedDocumentDiagnosticReport)
        for item in second.values()
    )

    # a file changed on disk is reported again, the others stay unchanged
    big.write_text(NOT_FITTING.replace("adamw_torch", "paged_adamw_8bit"), encoding="utf-8")
    stat = big.stat()
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    third = await pull(client, previous)
    assert isinstance(third[uri_of(big)], types.WorkspaceFullDocumentDiagnosticReport)
    assert third[uri_of(big)].result_id != first[uri_of(big)].result_id
    lora = third[uri_of(workdir / "lora.py")]
    assert isinstance(lora, types.WorkspaceUnchangedDocumentDiagnosticReport)

    # an open document is reported from its analysis, with its version; its id holds until
    # it changes
    uri = open_document(client, workdir / "lora.py", NOT_FITTING, version=3)
    for _ in range(100):  # until its first analysis is done
        fourth = await pull(client)
        if uri in fourth and fourth[uri].version == 3:
            break
        await asyncio.sleep(0.1)
    opened = fourth[uri]
    assert opened.version == 3 and "LLM001" in codes(opened)
    fifth = await pull(client, [types.PreviousResultId(uri=uri, value=opened.result_id)])
    assert isinstance(fifth[uri], types.WorkspaceUnchangedDocumentDiagnosticReport)
    assert fifth[uri].version == 3

    # a setting that changes the findings changes every id
    client.set_configuration(options(gpu="T4"), section="llmmem")
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"llmmem": options(gpu="T4")})
    )
    later = [types.PreviousResultId(uri=uri_of(big), value=third[uri_of(big)].result_id)]
    for _ in range(100):
        sixth = await pull(client, later)
        if isinstance(sixth[uri_of(big)], types.WorkspaceFullDocumentDiagnosticReport):
            break
        await asyncio.sleep(0.1)
    report = sixth[uri_of(big)]
    assert isinstance(report, types.WorkspaceFullDocumentDiagnosticReport)
    assert any("T4" in d.message for d in report.items)
    assert not any("RTX-4090" in d.message for d in report.items)


@pytest.mark.asyncio
async def test_a_document_pull_with_a_result_id_that_holds_is_unchanged(
    client: LanguageClient, workdir: Path
) -> None:
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(VSCODE), initialization_options=options(gpu="T4")
        )
    )
    uri = open_document(client, workdir / "train.py", NOT_FITTING)
    params = types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
    first = await client.text_document_diagnostic_async(params)
    assert isinstance(first, types.RelatedFullDocumentDiagnosticReport) and first.result_id
    assert "LLM001" in [d.code for d in first.items]
    again = await client.text_document_diagnostic_async(
        types.DocumentDiagnosticParams(
            text_document=types.TextDocumentIdentifier(uri=uri), previous_result_id=first.result_id
        )
    )
    assert isinstance(again, types.RelatedUnchangedDocumentDiagnosticReport)
    assert again.result_id == first.result_id
    stale = await client.text_document_diagnostic_async(
        types.DocumentDiagnosticParams(
            text_document=types.TextDocumentIdentifier(uri=uri), previous_result_id="0#0"
        )
    )
    assert isinstance(stale, types.RelatedFullDocumentDiagnosticReport)


@pytest.mark.asyncio
async def test_each_workspace_folder_has_its_own_settings(
    client: LanguageClient, workdir: Path
) -> None:
    big_gpu, small_gpu = workdir / "cluster", workdir / "laptop"
    big_gpu.mkdir()
    small_gpu.mkdir()
    client.set_configuration(options(gpu="RTX-4090"), section="llmmem")
    client.set_configuration(options(gpu="H200"), section="llmmem", scope_uri=uri_of(big_gpu))
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(VSCODE),
            initialization_options=options(),
            workspace_folders=[
                types.WorkspaceFolder(uri=uri_of(big_gpu), name="cluster"),
                types.WorkspaceFolder(uri=uri_of(small_gpu), name="laptop"),
            ],
        )
    )
    on_cluster = open_document(client, big_gpu / "train.py", NOT_FITTING)
    on_laptop = open_document(client, small_gpu / "train.py", NOT_FITTING)
    reports = {}
    for uri in (on_cluster, on_laptop):
        report = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
        assert isinstance(report, types.RelatedFullDocumentDiagnosticReport)
        reports[uri] = report.items
    assert "LLM001" not in [d.code for d in reports[on_cluster]]  # 8B full fine-tune fits 141 GB
    assert any(d.code == "LLM001" and "RTX-4090" in d.message for d in reports[on_laptop])

    # the workspace pull reads a closed file with its folder's settings too
    (big_gpu / "other.py").write_text(NOT_FITTING, encoding="utf-8")
    (small_gpu / "other.py").write_text(NOT_FITTING, encoding="utf-8")
    pulled = await pull(client)
    assert "LLM001" not in codes(pulled[uri_of(big_gpu / "other.py")])
    assert "LLM001" in codes(pulled[uri_of(small_gpu / "other.py")])


@pytest.mark.asyncio
async def test_a_folder_added_brings_its_settings(client: LanguageClient, workdir: Path) -> None:
    cluster = workdir / "cluster"
    cluster.mkdir()
    client.set_configuration(options(gpu="RTX-4090"), section="llmmem")
    client.set_configuration(options(gpu="H200"), section="llmmem", scope_uri=uri_of(cluster))
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(VSCODE), initialization_options=options()
        )
    )
    uri = open_document(client, cluster / "train.py", NOT_FITTING)
    params = types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
    first = await client.text_document_diagnostic_async(params)
    assert isinstance(first, types.RelatedFullDocumentDiagnosticReport)
    assert "LLM001" in [d.code for d in first.items]  # the window's RTX-4090
    client.workspace_did_change_workspace_folders(
        types.DidChangeWorkspaceFoldersParams(
            event=types.WorkspaceFoldersChangeEvent(
                added=[types.WorkspaceFolder(uri=uri_of(cluster), name="cluster")], removed=[]
            )
        )
    )
    for _ in range(100):
        report = await client.text_document_diagnostic_async(params)
        assert isinstance(report, types.RelatedFullDocumentDiagnosticReport)
        if "LLM001" not in [d.code for d in report.items]:
            break
        await asyncio.sleep(0.1)
    assert "LLM001" not in [d.code for d in report.items]  # the folder's H200


def test_the_workspace_walk_reads_what_llmmem_lint_reads(workdir: Path) -> None:
    from llmmem.lint_command import iter_files
    from llmmem_lsp.workspace import training_files

    for name in (
        "train.py",
        "configs/ds.json",
        "configs/axolotl.yml",
        "run.sh",
        "notes.md",
        "nb.ipynb",
        ".venv/lib/site.py",
        "node_modules/x/index.json",
        "pkg/__pycache__/m.py",
        "pkg/.hidden.py",
        "pkg/deep/er/model.yaml",
    ):
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x: 1\n", encoding="utf-8")
    linted = [path for path in iter_files([str(workdir)]) if path.suffix != ".ipynb"]
    assert training_files([workdir]) == linted
    assert [p.relative_to(workdir).as_posix() for p in linted] == [
        "configs/axolotl.yml",
        "configs/ds.json",
        "pkg/deep/er/model.yaml",
        "run.sh",
        "train.py",
    ]


def recording_client() -> LanguageClient:
    """A client that records `$/progress` notifications as they come (partial results)."""
    from pygls.protocol import default_converter
    from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

    client = LanguageClient(converter_factory=default_converter)

    def on_progress(client: LanguageClient, params: types.ProgressParams) -> None:
        client.__dict__.setdefault("partials", []).append(params)

    def on_register(client: LanguageClient, params: types.RegistrationParams) -> None:
        return None

    features = {
        **DEFAULT_CLIENT_FEATURES,
        types.PROGRESS: on_progress,
        types.CLIENT_REGISTER_CAPABILITY: on_register,
    }
    register_lsp_features(client, features)
    return client


@pytest_lsp.fixture(
    config=ClientServerConfig(
        server_command=[sys.executable, "-m", "llmmem_lsp"],
        server_env=SERVER_ENV,
        client_factory=recording_client,
    )
)
async def partial_client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    yield lsp_client
    await lsp_client.shutdown_session()


@pytest.mark.asyncio
async def test_a_client_with_a_partial_result_token_gets_the_reports_as_they_come(
    partial_client: LanguageClient, workdir: Path
) -> None:
    client = partial_client
    for index in range(3):
        (workdir / f"train_{index}.py").write_text(NOT_FITTING, encoding="utf-8")
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(VSCODE),
            initialization_options=options(gpu="RTX-4090"),
            workspace_folders=[types.WorkspaceFolder(uri=uri_of(workdir), name="work")],
        )
    )
    final = await client.workspace_diagnostic_async(
        types.WorkspaceDiagnosticParams(previous_result_ids=[], partial_result_token="pull-1")
    )
    partials = [p for p in client.__dict__.get("partials", []) if p.token == "pull-1"]
    assert list(final.items) == []  # everything came as partial results
    assert len(partials) >= 3  # one after each file analysed
    reported = {item["uri"]: item for p in partials for item in p.value["items"]}
    assert set(reported) == {uri_of(workdir / f"train_{i}.py") for i in range(3)}
    assert all(item["kind"] == "full" for item in reported.values())
    assert all(any(d["code"] == "LLM001" for d in item["items"]) for item in reported.values())

    # nothing analysed afresh: one final result, no partial ones
    count = len(client.__dict__.get("partials", []))
    again = await client.workspace_diagnostic_async(
        types.WorkspaceDiagnosticParams(
            previous_result_ids=[
                types.PreviousResultId(uri=uri, value=item["resultId"])
                for uri, item in reported.items()
            ],
            partial_result_token="pull-2",
        )
    )
    assert len(client.__dict__.get("partials", [])) == count
    assert len(again.items) == 3
    assert all(
        isinstance(item, types.WorkspaceUnchangedDocumentDiagnosticReport) for item in again.items
    )
