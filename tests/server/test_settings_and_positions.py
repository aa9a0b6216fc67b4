"""The server's settings reader and its column conversion, without a client."""

from __future__ import annotations

from llmmem.plan import SourceRange
from llmmem_lsp.convert import Lines
from llmmem_lsp.settings import ServerSettings, read_settings


def test_settings_read_camel_case_from_either_shape() -> None:
    flat, problems = read_settings({"gpu": " A100-80GB ", "worldSize": 8, "hub": False})
    nested, _ = read_settings({"llmmem": {"gpu": "A100-80GB", "worldSize": 8, "hub": False}})
    assert problems == []
    assert flat == nested
    assert flat.gpu == "A100-80GB" and flat.world_size == 8 and flat.hub is False


def test_bad_settings_keep_their_defaults_and_say_why() -> None:
    settings, problems = read_settings(
        {
            "gpu": 80,
            "worldSize": -2,
            "hub": "yes",
            "severity": {"llm001": "loud", "LLM004": "OFF"},
            "debounceMs": 99_999,
        }
    )
    defaults = ServerSettings()
    assert settings.gpu == defaults.gpu
    assert settings.world_size == defaults.world_size
    assert settings.hub is defaults.hub
    assert settings.debounce_ms == defaults.debounce_ms
    assert settings.severity == {"LLM004": "off"}
    assert len(problems) == 5
    assert any(
        "llmmem.severity.llm001 must be one of error, warning, info, off" in p for p in problems
    )
    assert read_settings("A100")[1] == ["llmmem settings must be an object, got str"]


def test_settings_update_on_top_of_the_current_ones() -> None:
    first, _ = read_settings({"gpu": "H100", "worldSize": 4})
    second, _ = read_settings({"worldSize": None}, first)
    assert second.gpu == "H100" and second.world_size is None
    cleared, _ = read_settings({"gpu": ""}, second)
    assert cleared.gpu is None


def test_columns_convert_between_code_points_and_each_encoding() -> None:
    text = 'x = "🚀é"  # a\nb = 1'
    # code point 7 is just after the closing quote: 🚀 is 2 UTF-16 units and 4 UTF-8 bytes
    col = text.index('"', 5) + 1
    assert Lines(text, "utf-32").to_client_col(0, col) == col
    assert Lines(text, "utf-16").to_client_col(0, col) == col + 1
    assert Lines(text, "utf-8").to_client_col(0, col) == col + 3 + 1
    for encoding in ("utf-8", "utf-16", "utf-32"):
        lines = Lines(text, encoding)
        assert lines.from_client_col(0, lines.to_client_col(0, col)) == col
    converted = Lines(text).range(SourceRange(start_line=1, start_col=4, end_line=1, end_col=5))
    assert (converted.start.line, converted.start.character) == (1, 4)
    # a range past the end of a shorter (older) text is clamped, not an error
    beyond = Lines("a").position(5, 9)
    assert beyond.line == 0 and beyond.character == 1
