"""Per-document analysis: debounced, off the event loop, one version at a time.

Each open document has a `DocumentState`. An edit cancels the pending analysis and schedules a
new one after the debounce; the analysis runs in a worker thread on a snapshot of the text and
its version; when it finishes, the result is kept only if the document is still at that version.
One analysis runs at a time. An analysis that takes longer than `analysis_timeout_s` is abandoned:
its thread is told to stop (the script reader stops within a few milliseconds) and is left to end
on its own as a daemon thread, the next document's analysis starts at once, and the document
keeps its last result (or, with none, a diagnostic that says the analysis was stopped).
A file that cannot be parsed (a syntax error mid-typing) leaves the last good result in place.
Model lookups on the Hugging Face Hub never run inside an analysis: an analysis uses what is on
disk (catalog, HF cache, earlier lookups) and, when the model is unknown, a separate background
lookup is started; when it lands, the document is analysed again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmmem_lsp.preload import PreloadingExecutor, preload
from llmmem_lsp.settings import ServerSettings

if TYPE_CHECKING:  # imported by the first analysis, not at start
    from llmmem.check import Checked

log = logging.getLogger("llmmem_lsp")

SUFFIX_BY_LANGUAGE = {
    "python": ".py",
    "yaml": ".yaml",
    "json": ".json",
    "jsonc": ".json",
    "shellscript": ".sh",
    "sh": ".sh",
    "bash": ".sh",
    "jupyter": ".ipynb",
}


_RESULT_SERIALS = itertools.count(1)


@dataclass
class Result:
    """One finished analysis of one version of a document."""

    version: int | None
    text: str
    checked: Checked
    serial: int = field(default_factory=lambda: next(_RESULT_SERIALS))  # one per analysis

    @property
    def unreadable(self) -> str | None:
        return self.checked.analysis.plan.unreadable


@dataclass
class DocumentState:
    uri: str
    path: Path
    version: int | None = None
    task: asyncio.Task[None] | None = None
    result: Result | None = None  # the newest good analysis
    latest: Result | None = None  # the newest analysis, good or not
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set: nothing pending
    measured: str | None = None  # the last `llmmem.verify` result, as Markdown
    measured_version: int | None = None  # the version of the text it measured
    measured_report: dict[str, Any] | None = None  # that run's report (`llmmem verify` JSON)
    abandoned: float | None = None  # seconds, when the last analysis was abandoned
    debouncing: bool = False  # the pending analysis still waits out the quiet time
    dependencies: set[str] = field(default_factory=set)  # other files the plan read
    # hover texts of the current result, by (result serial, target, cell path, verify table,
    # staleness line):
    # a hover on the same setting again is not rendered again (a DPO budget with its
    # reference model and the setting's half and double takes ~20 ms to render)
    hovers: dict[tuple[int, str, str | None, str | None, str | None], str] = field(
        default_factory=dict
    )


def document_path(uri: str, fs_path: str | None, language_id: str | None) -> Path:
    """The path extraction sees: the file's own, or `untitled.<suffix>` by language."""
    if fs_path:
        return Path(fs_path)
    suffix = SUFFIX_BY_LANGUAGE.get(language_id or "", ".py")
    return Path.cwd() / f"untitled{suffix}"


def plan_dependencies(checked: Checked) -> set[str]:
    """The other files a plan's values were read from (DeepSpeed JSON, accelerate YAML, ...)."""
    plan = checked.analysis.plan
    paths: set[str] = set()

    def visit(value: object) -> None:
        source_range = getattr(value, "range", None)
        where = getattr(source_range, "path", None)
        if isinstance(where, str) and where:
            paths.add(str(Path(where).resolve()) if not where.startswith("<") else where)

    for sourced in plan.sourced_fields().values():
        visit(sourced)
    for group in (plan.lora, plan.quantization, plan.distributed):
        if group is None:
            continue
        for item in fields(group):
            visit(getattr(group, item.name))
    deepspeed = plan.distributed.deepspeed_config.value
    if isinstance(deepspeed, str) and deepspeed:
        config = Path(deepspeed)
        if not config.is_absolute():
            config = Path(plan.path).parent / config
        paths.add(str(config.resolve()))
    if checked.settings.path:
        paths.add(str(Path(checked.settings.path).resolve()))
    return paths


class Analyzer:
    """Runs analyses for the server and decides which results stand."""

    def __init__(
        self,
        get_text: Callable[[str], tuple[str, int | None] | None],
        on_result: Callable[[DocumentState, Result], Awaitable[None]],
        on_abandoned: Callable[[DocumentState], Awaitable[None]] | None = None,
    ) -> None:
        self.get_text = get_text  # uri -> (text, version) of the open document, or None
        self.on_result = on_result  # called on the event loop for each result that stands
        self.on_abandoned = on_abandoned  # called when an analysis ran past its timeout
        self.settings = ServerSettings()
        # per workspace folder (its resolved path), where the editor answers for that scope
        self.folder_settings: dict[str, ServerSettings] = {}
        self.detected_gpu: str | None = None
        self.documents: dict[str, DocumentState] = {}
        self._analysis_slot: asyncio.Lock | None = None  # one analysis at a time
        self._running: set[threading.Event] = set()  # stop signals of analyses in flight
        self.closed = False  # after `shutdown`: nothing more is published
        self._hub_pool = PreloadingExecutor(max_workers=2, thread_name_prefix="llmmem-hub")
        self._hub_tried: set[str] = set()
        # lookups in flight, by model id (held so that they are not collected mid-flight)
        self._hub_pending: dict[str, asyncio.Future[None]] = {}

    # -- scheduling -----------------------------------------------------------------------

    def open(self, uri: str, path: Path, version: int | None) -> DocumentState:
        state = self.documents.get(uri)
        if state is None:
            state = DocumentState(uri=uri, path=path)
            self.documents[uri] = state
        state.version = version
        self.schedule(state, delay=0.0)
        return state

    def close(self, uri: str) -> None:
        state = self.documents.pop(uri, None)
        if state is not None and state.task is not None:
            state.task.cancel()

    def changed(self, uri: str, version: int | None) -> None:
        state = self.documents.get(uri)
        if state is None:
            return
        state.version = version
        self.schedule(state)

    def schedule(self, state: DocumentState, delay: float | None = None) -> None:
        """Analyse `state` after the debounce, cancelling what was pending for it."""
        if state.task is not None and not state.task.done():
            state.task.cancel()
        state.done.clear()
        wait = self.settings.debounce_ms / 1000 if delay is None else delay
        state.debouncing = wait > 0
        state.task = asyncio.get_running_loop().create_task(self._run(state, wait))

    def reanalyse_all(self) -> None:
        for state in list(self.documents.values()):
            self.schedule(state, delay=0.0)

    def reanalyse_dependents(self, changed_path: str) -> list[str]:
        """Schedule every document whose plan read `changed_path`; returns their URIs."""
        try:
            resolved = str(Path(changed_path).resolve())
        except (OSError, RuntimeError):
            resolved = changed_path
        hit = []
        for state in list(self.documents.values()):
            if resolved in state.dependencies:
                self.schedule(state, delay=0.0)
                hit.append(state.uri)
        return hit

    def hurry(self, state: DocumentState) -> None:
        """Start the pending analysis now: a request (a hover) came, the user stopped typing."""
        if state.debouncing and state.task is not None and not state.task.done():
            self.schedule(state, delay=0.0)

    async def wait_current(self, state: DocumentState, timeout: float) -> None:
        """Wait (at most `timeout`) for the analysis of the document's current version."""
        try:
            await asyncio.wait_for(state.done.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    # -- one analysis -----------------------------------------------------------------------

    def settings_for(self, path: Path) -> ServerSettings:
        """The settings of the workspace folder that holds `path` (the innermost one), else
        the window's."""
        if not self.folder_settings:
            return self.settings
        try:
            resolved = path.resolve()
        except (OSError, RuntimeError):
            resolved = path
        best: tuple[int, ServerSettings] | None = None
        for folder, settings in self.folder_settings.items():
            if resolved.is_relative_to(folder) and (best is None or len(folder) > best[0]):
                best = (len(folder), settings)
        return best[1] if best is not None else self.settings

    def _gpu_fallback(self, settings: ServerSettings | None = None) -> str | None:
        return (settings or self.settings).gpu or self.detected_gpu

    def analyse_now(self, path: Path, text: str) -> Checked:
        """The analysis itself (runs in the worker thread); never touches the network."""
        from llmmem.check import check_text

        settings = self.settings_for(path)
        return check_text(
            path,
            text,
            fallback_gpu=self._gpu_fallback(settings),
            hub=False,
            world_size=settings.world_size,
            severity=settings.severity,
        )

    async def _run(self, state: DocumentState, delay: float) -> None:
        try:
            if delay > 0:
                await asyncio.sleep(delay)
            if state.task is asyncio.current_task():
                state.debouncing = False
            snapshot = self.get_text(state.uri)
            if snapshot is None:
                state.done.set()
                return
            text, version = snapshot
            if self._analysis_slot is None:
                self._analysis_slot = asyncio.Lock()
            timeout = self.settings.analysis_timeout_s
            async with self._analysis_slot:
                try:
                    checked = await self._analyse_in_thread(state.path, text, timeout)
                except asyncio.TimeoutError:
                    log.warning("analysis of %s abandoned after %.1f s", state.uri, timeout)
                    if state.version == version and self.documents.get(state.uri) is state:
                        state.abandoned = timeout
                        state.done.set()
                        if self.on_abandoned is not None:
                            await self.on_abandoned(state)
                    return
                except Exception:  # a gap in the analyzer must not take the editor down
                    log.exception("analysis of %s failed", state.uri)
                    state.done.set()
                    return
            if state.version != version or self.documents.get(state.uri) is not state:
                return  # a newer version is scheduled; this result is never shown
            if self.closed:
                return  # stopped by `shutdown`: what it read is not the whole file
            state.abandoned = None
            result = Result(version=version, text=text, checked=checked)
            state.latest = result
            if result.unreadable is None or state.result is None:
                state.result = result
                state.dependencies = plan_dependencies(checked)
            state.done.set()
            await self.on_result(state, result)
            self._maybe_look_up(state, checked)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("publishing the analysis of %s failed", state.uri)
            state.done.set()

    async def _analyse_in_thread(self, path: Path, text: str, timeout: float) -> Checked:
        """`analyse_now` in a daemon thread of its own; past `timeout` (asyncio.TimeoutError) or
        when the caller is cancelled, the thread is told to stop and left to end on its own."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[Checked] = loop.create_future()
        stop = threading.Event()

        def deliver(outcome: Checked | BaseException) -> None:
            if finished.done():
                return
            if isinstance(outcome, BaseException):
                finished.set_exception(outcome)
            else:
                finished.set_result(outcome)

        def work() -> None:
            outcome: Checked | BaseException
            try:
                from llmmem.extract.python import stop_when

                with stop_when(stop.is_set):
                    outcome = self.analyse_now(path, text)
            except Exception as err:
                outcome = err
            try:
                loop.call_soon_threadsafe(deliver, outcome)
            except RuntimeError:  # the event loop is gone: the server is exiting
                pass
            finally:
                self._running.discard(stop)

        preload()  # every first import on this thread, none racing in the workers
        self._running.add(stop)
        threading.Thread(target=work, name="llmmem-analysis", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(finished), timeout)
        except BaseException:  # the timeout, or a newer version cancelled this one
            stop.set()
            raise

    # -- background hub lookups -------------------------------------------------------------

    def _maybe_look_up(self, state: DocumentState, checked: Checked) -> None:
        analysis = checked.analysis
        plan = analysis.plan
        if plan.model_id is None or not self.settings.hub or not checked.settings.hub:
            return
        if analysis.spec is not None and not analysis.spec.is_guess:
            return
        model_id = str(plan.model_id.value)
        if model_id in self._hub_tried:
            return
        self._hub_tried.add(model_id)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(
            self._hub_pool,
            self._look_up,
            model_id,
            state.path,
            dict(checked.settings.local_model_paths),
        )
        self._hub_pending[model_id] = future

        def landed(_: object) -> None:
            self._hub_pending.pop(model_id, None)
            for other in list(self.documents.values()):
                result = other.result
                model = result.checked.analysis.plan.model_id if result else None
                if model is not None and str(model.value) == model_id:
                    self.schedule(other, delay=0.0)

        future.add_done_callback(landed)

    def _look_up(self, model_id: str, path: Path, local_paths: dict[str, str]) -> None:
        """Resolve on the hub (bounded by the timeout); the disk cache keeps the answer."""
        from llmmem.models.resolve import ModelResolutionError, resolve_model

        try:
            resolve_model(
                model_id,
                hub=True,
                hub_timeout_s=self.settings.hub_timeout_s,
                local_model_paths=local_paths,
                base_dir=path.parent,
            )
        except ModelResolutionError as err:
            log.info("hub lookup of %s: %s", model_id, err)
        except Exception:
            log.exception("hub lookup of %s failed", model_id)

    def forget_hub_lookups(self) -> None:
        self._hub_tried.clear()

    def shutdown(self) -> None:
        self.closed = True
        for stop in list(self._running):
            stop.set()
        self._hub_pool.shutdown(wait=False, cancel_futures=True)
