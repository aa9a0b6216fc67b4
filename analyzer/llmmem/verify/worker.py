"""The subprocess that runs one step: `python -m llmmem.verify.worker REQUEST.json OUT.json`
(for a multi-rank plan, under torchrun, each rank writing OUT.json.rank<N>).

It writes each stage it reaches to stderr (`stage: build`, ...) for the progress display and the
measurement as JSON to OUT.json, also when the step fails; a hang is ended by the parent's timeout.
"""

from __future__ import annotations

import json
import sys
import warnings


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m llmmem.verify.worker REQUEST.json OUT.json", file=sys.stderr)
        return 2
    from llmmem.verify.request import StepRequest

    with open(argv[0], encoding="utf-8") as handle:
        request = StepRequest.from_json(json.load(handle))
    print("stage: loading torch and transformers", file=sys.stderr, flush=True)
    warnings.filterwarnings("ignore")
    from llmmem.verify.runner import run_step

    print(f"stage: running one {request.device} step", file=sys.stderr, flush=True)
    measurement = run_step(request)
    out = argv[1]
    if request.launched:  # under torchrun: one file per rank
        import os

        out = f"{out}.rank{os.environ.get('RANK', measurement.rank)}"
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(measurement.to_json(), handle)
    print("stage: done", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
