"""The rules reference (`rules.md` beside this module), generated from the rules themselves.

`python -m llmmem.rules.docs` rewrites it; a test fails when it is out of date.
"""

from __future__ import annotations

from pathlib import Path

from llmmem.rules.catalog import all_rules

RULES_DOC = Path(__file__).resolve().parent / "rules.md"


def render_rules_doc() -> str:
    parts = [
        "# llmmem rules\n\n"
        "Generated from the rules by `python -m llmmem.rules.docs`; do not edit by hand.\n\n"
        "| code | name | severity | what it checks |\n| --- | --- | --- | --- |\n"
    ]
    rules = all_rules()
    parts += [f"| {r.code} | {r.name} | {r.severity.value} | {r.summary} |\n" for r in rules]
    parts += ["\n" + rule.doc().replace(f"# {rule.code}", f"## {rule.code}", 1) for rule in rules]
    return "".join(parts)


if __name__ == "__main__":
    RULES_DOC.write_text(render_rules_doc(), encoding="utf-8")
    print(f"wrote {RULES_DOC}")
