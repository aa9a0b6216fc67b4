"""One deadline for all the hub lookups of a command-line run: ten unknown models against an
endpoint that never answers in time take the run's deadline, not ten per-model timeouts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

RUN_DEADLINE_S = 2.0  # below the 3 s a single lookup may wait


class SlowHub:
    """A local HTTP server that answers every request after `delay_s` seconds."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                hub.requests.append(self.path)
                time.sleep(hub.delay_s)
                try:
                    self.send_response(404)
                    self.end_headers()
                except OSError:
                    pass  # the client gave up first

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slow_hub() -> Iterator[SlowHub]:
    hub = SlowHub(delay_s=10.0)
    yield hub
    hub.close()


def test_ten_unknown_models_share_one_deadline(tmp_path: Path, slow_hub: SlowHub) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / ".git").mkdir()
    for index in range(10):
        (project / f"train_{index}.py").write_text(
            f"# llmmem: model=my-org/unreleased-model-{index} batch=1 seq=512\n"
        )
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env.update(
        HF_ENDPOINT=slow_hub.endpoint,
        HF_HOME=str(tmp_path / "hf-home"),
        LLMMEM_CACHE_DIR=str(tmp_path / "llmmem-cache"),
        LLMMEM_HUB_DEADLINE_S=str(RUN_DEADLINE_S),
    )
    lint = str(Path(sys.executable).parent / "llmmem-lint")
    start = time.monotonic()
    proc = subprocess.run(
        [lint, "--hub", "--gpu", "A100-80GB", "--format", "full", "."],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - start
    assert "Traceback" not in proc.stderr, proc.stderr
    assert slow_hub.requests, "the run never asked the hub"
    assert proc.stdout.count("LLM010") == 10, proc.stdout  # each model unsized, with why
    assert elapsed < RUN_DEADLINE_S + 1.0, f"{elapsed:.1f} s for ten lookups"
