"""The releases of the training stack a file will run with, and where each was read.

A step's memory depends on a few library releases (transformers 5 keeps MoE experts as 3-D
parameters that bitsandbytes does not quantize; bitsandbytes before 0.43.2 keeps the 4-bit
matmul's input; torch before 2.0 zeroes gradients instead of freeing them). For a file, each
library's release is looked up, first source that names it wins:

1. the environment the file will run in, read from its installed distributions' metadata (the
   `*.dist-info` folders and their METADATA `Version:` line; nothing is imported or run):
   the environment named by `LLMMEM_RUN_ENV` (an interpreter such as `.venv/bin/python`, or an
   environment's folder), else a virtual environment (`.venv`, `venv`, `env`, `.env` holding a
   `pyvenv.cfg`) in the file's folder or a folder above it;
2. the workspace's requirement and lock files, nearest folder first: `uv.lock`, `poetry.lock`,
   `requirements*.txt`, `environment.yml`, `pyproject.toml` (`[project]` dependencies and
   optional dependencies, `[dependency-groups]`, `[tool.poetry.dependencies]`). A lock file or an
   exact pin (`==4.44.0`, conda's `=4.44.0`, Poetry's bare `4.44.0`) names the release; a range
   (`>=4.40,<5`) names it only when the tests' release is outside it (then its lower bound);
3. the releases the tests pin (`tests/constraints.txt`), the releases the core was checked
   against.

The folders above a file are searched up to the first one that holds `.git` (the workspace
root), at most 12 levels. Everything read is cached by modification time, so a language server
that asks again and again reads the disk only when something changed.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# the libraries whose releases change what a training step holds, or which stack runs it
LIBRARIES = (
    "torch",
    "transformers",
    "peft",
    "trl",
    "bitsandbytes",
    "deepspeed",
    "accelerate",
    "torchtune",
    "unsloth",
)

# the releases tests/constraints.txt pins (tests/cli/test_versions.py checks they agree); TRL
# (pinned there only for the tests that run its trainers) and torchtune are not among them:
# without another source they are unknown
TESTED_RELEASES = {
    "torch": "2.13.0",
    "deepspeed": "0.19.8",
    "transformers": "5.24.0",
    "peft": "0.21.2",
    "accelerate": "1.15.0",
    "bitsandbytes": "0.50.2",
}
TESTED_SOURCE = "the tests' pin"

# distribution names that are another spelling of one of LIBRARIES (conda's pytorch)
ALIASES = {"pytorch": "torch", "bitsandbytes-cuda": "bitsandbytes"}
VENV_NAMES = (".venv", "venv", "env", ".env")
MAX_LEVELS = 12
MAX_FILE_BYTES = 8 * 1024 * 1024
RUN_ENV_VARIABLE = "LLMMEM_RUN_ENV"


@dataclass(frozen=True, slots=True)
class FoundVersion:
    library: str
    version: str  # as written: "4.44.0", "2.13.0+cpu"
    source: str  # a short label: "requirements.txt", ".venv", "the tests' pin"
    kind: str  # "environment", "workspace", "default"
    path: str | None = None  # the file or the site-packages folder it was read from
    line: int | None = None  # 0-based line in `path`, where known
    note: str = ""  # e.g. the range a requirement allows

    @property
    def label(self) -> str:
        """`transformers 4.44.0 (requirements.txt)`."""
        return f"{self.library} {self.version} ({self.source})"

    @property
    def release(self) -> str:
        """ "major.minor", as TrainingSetup's version fields take it."""
        match = re.match(r"(\d+)\.(\d+)", self.version)
        return f"{int(match.group(1))}.{int(match.group(2))}" if match else self.version

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "source": self.source,
            "kind": self.kind,
            "path": self.path,
            "line": self.line,
            "label": self.label,
            **({"note": self.note} if self.note else {}),
        }


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them, with the aliases above."""
    key = re.sub(r"[-_.]+", "-", name.strip()).lower()
    return ALIASES.get(key, key)


# -- the file system, cached by modification time ---------------------------------------------

_CACHE: dict[tuple[str, str], tuple[tuple[int, int], Any]] = {}


def _cached(kind: str, path: Path, read: Any) -> Any:
    """`read(path)`, again only when the path's modification time or size changed; None for a
    path that is missing, unreadable, or not a regular file (a FIFO would block a read)."""
    try:
        st = path.stat()
    except OSError:
        return None
    wanted = stat.S_ISDIR if kind == "dir" else stat.S_ISREG
    if not wanted(st.st_mode):
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    key = (kind, str(path))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        value = read(path)
    except (OSError, UnicodeDecodeError, ValueError):
        value = None
    _CACHE[key] = (stamp, value)
    return value


def _listing(folder: Path) -> frozenset[str]:
    found = _cached("dir", folder, lambda p: frozenset(os.listdir(p)))
    return found or frozenset()


def _text(path: Path) -> str:
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ValueError("too large")
    return path.read_text(encoding="utf-8", errors="replace")


# -- installed distributions -------------------------------------------------------------------


def site_packages(environment: Path) -> list[Path]:
    """The site-packages folders of an environment's folder (venv or conda, POSIX or Windows)."""
    out = []
    for lib in ("lib", "lib64", "Lib"):
        base = environment / lib
        names = _listing(base)
        if lib == "Lib" and "site-packages" in names:
            out.append(base / "site-packages")
        for name in sorted(names, reverse=True):
            if name.startswith("python") and "site-packages" in _listing(base / name):
                out.append(base / name / "site-packages")
    return out


def _metadata_version(dist_info: Path) -> str | None:
    text = _cached("meta", dist_info / "METADATA", lambda p: p.read_bytes()[:4096].decode())
    if text is None:
        text = _cached("meta", dist_info / "PKG-INFO", lambda p: p.read_bytes()[:4096].decode())
    if not text:
        return None
    match = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
    return match.group(1) if match else None


def installed_versions(site: Path) -> dict[str, str]:
    """{library: version} of LIBRARIES installed in one site-packages folder, from each
    distribution's metadata (the folder name says which distribution; METADATA says the
    version, the folder name's version where METADATA cannot be read)."""
    found: dict[str, str] = {}
    for entry in _listing(site):
        if not entry.endswith((".dist-info", ".egg-info")):
            continue
        stem = entry.rsplit(".", 1)[0]
        name, _, rest = stem.partition("-")
        library = normalize(name)
        if library not in LIBRARIES:
            continue
        version = _metadata_version(site / entry) or rest.split("-")[0]
        if version:
            found[library] = version
    return found


def _environment_folder(configured: str) -> Path | None:
    """An environment's folder from an interpreter path or the folder itself."""
    path = Path(configured).expanduser()
    if path.is_dir():
        return path
    # bin/python (POSIX) or Scripts/python.exe (Windows venv) or python.exe (conda on Windows)
    if path.parent.name in ("bin", "Scripts"):
        return path.parent.parent
    return path.parent if path.exists() else None


def _venv_in(folder: Path) -> Path | None:
    names = _listing(folder)
    for name in VENV_NAMES:
        if name in names and "pyvenv.cfg" in _listing(folder / name):
            return folder / name
    return None


# -- requirement and lock files ----------------------------------------------------------------

_REQUIREMENT = re.compile(
    r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(\(?\s*[=<>!~][^;#]*?)?\s*\)?\s*(?:[;#].*)?$"
)
_LOCKED = re.compile(r'^\[\[package\]\]\s*\nname\s*=\s*"([^"]+)"\s*\nversion\s*=\s*"([^"]+)"', re.M)


@dataclass(frozen=True, slots=True)
class _Requirement:
    library: str
    spec: str  # "==4.44.0", ">=4.40,<5", "" (any)
    line: int
    origin: str | None = None  # the file it is written in, when another one includes it


def _requirement(text: str, line: int) -> _Requirement | None:
    match = _REQUIREMENT.match(text)
    if not match:
        return None
    library = normalize(match.group(1))
    if library not in LIBRARIES:
        return None
    return _Requirement(library, (match.group(2) or "").replace(" ", "").strip("()"), line)


_INCLUDE = re.compile(r"^(?:-r|--requirement|-c|--constraint)(?:\s+|=)(\S+)")


def _requirements_txt(path: Path, depth: int = 0) -> list[_Requirement]:
    """A pip requirements file; the files it includes (`-r`, `-c`) are read after its own
    lines, up to three levels deep."""
    out = []
    included = []
    for number, raw in enumerate(_text(path).splitlines()):
        stripped = raw.strip()
        include = _INCLUDE.match(stripped)
        if include:
            included.append(path.parent / include.group(1))
            continue
        if not stripped or stripped.startswith(("#", "-", "http:", "https:", "git+")):
            continue
        found = _requirement(stripped, number)
        if found:
            out.append(found if depth == 0 else replace(found, origin=str(path)))
    for other in included if depth < 3 else []:
        try:
            if stat.S_ISREG(other.stat().st_mode):
                out += _requirements_txt(other, depth + 1)
        except (OSError, ValueError):
            continue
    return out


def _environment_yml(path: Path) -> list[_Requirement]:
    """conda's `- pytorch=2.1.0=py3.10_cuda...` and pip's `- transformers==4.44.0` lines."""
    out = []
    for number, raw in enumerate(_text(path).splitlines()):
        match = re.match(r"^\s*-\s*([^\s#]+)\s*(?:#.*)?$", raw)
        if not match:
            continue
        item = match.group(1).split("::")[-1]  # channel::package
        conda = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)=([^=<>!~]+)(?:=.*)?$", item)
        if conda and normalize(conda.group(1)) in LIBRARIES:
            version = conda.group(2).rstrip("*").rstrip(".")
            out.append(_Requirement(normalize(conda.group(1)), f"=={version}", number))
            continue
        found = _requirement(item, number)
        if found:
            out.append(found)
    return out


def _line_of(text: str, library: str) -> int | None:
    pattern = re.compile(rf"""(^|["'\s]){re.escape(library)}\b""", re.I)
    for number, line in enumerate(text.splitlines()):
        if pattern.search(line):
            return number
    return None


def _poetry_spec(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("version", "")
    if not isinstance(value, str):
        return ""
    value = value.strip()
    if re.fullmatch(r"\d+(\.\d+)*", value):
        return f"=={value}"
    caret = re.fullmatch(r"\^(\d+)(?:\.(\d+))?(?:\.(\d+))?", value)
    if caret:  # ^4.44.0 is >=4.44.0,<5
        lower = ".".join(part for part in caret.groups() if part is not None)
        return f">={lower},<{int(caret.group(1)) + 1}"
    tilde = re.fullmatch(r"~(\d+)\.(\d+)(?:\.(\d+))?", value)
    if tilde:  # ~4.44.0 is >=4.44.0,<4.45
        lower = ".".join(part for part in tilde.groups() if part is not None)
        return f">={lower},<{tilde.group(1)}.{int(tilde.group(2)) + 1}"
    return value.replace(" ", "")


def _pyproject(path: Path) -> list[_Requirement]:
    import tomllib

    text = _text(path)
    if not any(library in text for library in LIBRARIES):
        return []
    document = tomllib.loads(text)
    items: list[str] = []
    project = document.get("project") or {}
    items += [d for d in project.get("dependencies") or [] if isinstance(d, str)]
    for group in (project.get("optional-dependencies") or {}).values():
        items += [d for d in group or [] if isinstance(d, str)]
    for group in (document.get("dependency-groups") or {}).values():
        items += [d for d in group or [] if isinstance(d, str)]
    out = []
    for item in items:
        found = _requirement(item, 0)
        if found:
            out.append(_Requirement(found.library, found.spec, _line_of(text, found.library) or 0))
    poetry = ((document.get("tool") or {}).get("poetry") or {}).get("dependencies") or {}
    for name, value in poetry.items():
        library = normalize(name)
        if library in LIBRARIES:
            out.append(_Requirement(library, _poetry_spec(value), _line_of(text, name) or 0))
    return out


def _lock(path: Path) -> list[_Requirement]:
    text = _text(path)
    out = []
    for match in _LOCKED.finditer(text):
        library = normalize(match.group(1))
        if library in LIBRARIES:
            line = text.count("\n", 0, match.start())
            out.append(_Requirement(library, f"=={match.group(2)}", line))
    return out


def _workspace_files(folder: Path) -> list[tuple[Path, Any]]:
    """The requirement and lock files of one folder, in the order they are trusted."""
    names = _listing(folder)
    out: list[tuple[Path, Any]] = []
    for name in ("uv.lock", "poetry.lock"):
        if name in names:
            out.append((folder / name, _lock))
    requirements = sorted(
        n for n in names if n.startswith("requirements") and n.endswith((".txt", ".in"))
    )
    requirements.sort(key=lambda n: (n != "requirements.txt", n.endswith(".in"), n))
    out += [(folder / n, _requirements_txt) for n in requirements]
    for name in ("environment.yml", "environment.yaml"):
        if name in names:
            out.append((folder / name, _environment_yml))
    if "pyproject.toml" in names:
        out.append((folder / "pyproject.toml", _pyproject))
    return out


# -- versions and specifiers -------------------------------------------------------------------


def _parts(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if not match:
        raise ValueError(version)
    return tuple(int(p) for p in match.group(0).split("."))


def _compare(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (a > b) - (a < b)


def _clause_allows(version: tuple[int, ...], clause: str) -> bool:
    match = re.match(r"(===|==|!=|>=|<=|~=|>|<)?(.+)", clause)
    if not match:
        return True
    op, text = match.group(1) or "==", match.group(2)
    if text.endswith(".*"):
        prefix = _parts(text[:-2])
        same = version[: len(prefix)] == prefix
        return same if op == "==" else (not same) if op == "!=" else True
    bound = _parts(text)
    order = _compare(version, bound)
    if op in ("==", "==="):
        return order == 0
    if op == "!=":
        return order != 0
    if op == ">=":
        return order >= 0
    if op == "<=":
        return order <= 0
    if op == ">":
        return order > 0
    if op == "<":
        return order < 0
    # ~=X.Y.Z: >=X.Y.Z and the same X.Y
    return order >= 0 and version[: len(bound) - 1] == bound[: len(bound) - 1]


def pinned(spec: str) -> str | None:
    """The release an exact pin names: `==4.44.0` -> 4.44.0; None for a range."""
    clauses = [c for c in spec.split(",") if c]
    for clause in clauses:
        match = re.fullmatch(r"===?\s*(\d[\w.+!-]*)", clause)
        if match and "*" not in match.group(1):
            return match.group(1)
    return None


def allows(spec: str, version: str) -> bool:
    try:
        parts = _parts(version)
        return all(_clause_allows(parts, c) for c in spec.split(",") if c)
    except ValueError:
        return True


def lower_bound(spec: str) -> str | None:
    for clause in spec.split(","):
        match = re.fullmatch(r"(?:>=|~=|>)\s*(\d[\w.]*)", clause)
        if match:
            return match.group(1)
    return None


def _from_requirement(req: _Requirement, path: Path) -> FoundVersion | None:
    """A requirement that names a release, or a range that rules out the tests' release."""
    if req.origin:
        path = Path(req.origin)
    exact = pinned(req.spec)
    kind = "workspace"
    if exact:
        return FoundVersion(req.library, exact, path.name, kind, str(path), req.line)
    if not req.spec:
        return None
    tested = TESTED_RELEASES.get(req.library)
    if tested and allows(req.spec, tested):
        return FoundVersion(
            req.library,
            tested,
            f"the tests' pin, within {path.name}'s {req.spec}",
            kind,
            str(path),
            req.line,
            note=f"{path.name} allows {req.library}{req.spec}; the tests' release is within it",
        )
    low = lower_bound(req.spec)
    if low:
        return FoundVersion(
            req.library,
            low,
            f"{path.name}, lowest of {req.spec}",
            kind,
            str(path),
            req.line,
            note=f"{path.name} allows {req.library}{req.spec}: its lowest release is assumed",
        )
    return None


# -- the lookup --------------------------------------------------------------------------------


def _folders(start: Path) -> list[Path]:
    folder = start if start.is_dir() else start.parent
    out = []
    for _ in range(MAX_LEVELS):
        out.append(folder)
        if ".git" in _listing(folder) or folder.parent == folder:
            break
        folder = folder.parent
    return out


def _label_of_environment(environment: Path, start: Path) -> str:
    try:
        return os.path.relpath(environment, start)
    except ValueError:
        return str(environment)


def find_versions(start: Path | str, *, environment: str | None = None) -> dict[str, FoundVersion]:
    """Each of LIBRARIES' release for a file (or folder) at `start`, with its source; a library
    no source names and the tests do not pin is left out. `environment` (else the
    LLMMEM_RUN_ENV variable) names the interpreter or environment folder the file runs with."""
    start = Path(start).absolute()
    folders = _folders(start)
    base = folders[0]
    found: dict[str, FoundVersion] = {}
    configured = environment or os.environ.get(RUN_ENV_VARIABLE)
    env_folder = _environment_folder(configured) if configured else None
    if env_folder is None:
        for folder in folders:
            env_folder = _venv_in(folder)
            if env_folder is not None:
                break
    if env_folder is not None:
        label = _label_of_environment(env_folder, base)
        for site in site_packages(env_folder):
            for library, version in installed_versions(site).items():
                found.setdefault(
                    library, FoundVersion(library, version, label, "environment", str(site))
                )
    for folder in folders:
        for path, reader in _workspace_files(folder):
            missing = [library for library in LIBRARIES if library not in found]
            raw = _cached("text", path, _text) if missing else None
            includes = reader is _requirements_txt and re.search(
                r"(?m)^\s*-[rc]\b|--(?:requirement|constraint)\b", raw or ""
            )
            if not raw or not (includes or any(library in raw.lower() for library in missing)):
                continue  # nothing still missing is named there: not parsed
            for req in _cached("req:" + reader.__name__, path, reader) or []:
                if req.library in found:
                    continue
                from_file = _from_requirement(req, path)
                if from_file is not None:
                    found[req.library] = from_file
    for library, pin in TESTED_RELEASES.items():
        found.setdefault(library, FoundVersion(library, pin, TESTED_SOURCE, "default"))
    return {library: found[library] for library in LIBRARIES if library in found}


def setup_releases(versions: dict[str, FoundVersion]) -> dict[str, str]:
    """The TrainingSetup / QuantSetup fields the found versions set: "major.minor" each."""
    out = {}
    for library, field_name in (
        ("torch", "torch_version"),
        ("transformers", "transformers_version"),
        ("bitsandbytes", "bitsandbytes_version"),
        ("trl", "trl_version"),
    ):
        found = versions.get(library)
        if found is not None and re.match(r"\d+\.\d+", found.release):
            out[field_name] = found.release
    unsloth = versions.get("unsloth")
    # unsloth's releases are dates (2025.10.10) and its loss changed within a month: the whole
    # release, not "major.minor"
    calendar = re.match(r"\d{4}\.\d+(?:\.\d+)?", unsloth.version) if unsloth else None
    if calendar:
        out["unsloth_version"] = calendar.group(0)
    return out


def apply_to_setup(setup: Any, versions: dict[str, FoundVersion]) -> Any:
    """`setup` (a TrainingSetup) with the found torch, transformers, bitsandbytes and TRL
    releases."""

    fields = setup_releases(versions)
    quant_release = fields.pop("bitsandbytes_version", None)
    if quant_release and setup.quant is not None:
        fields["quant"] = replace(setup.quant, bitsandbytes_version=quant_release)
    return replace(setup, **fields) if fields else setup


def describe(versions: dict[str, FoundVersion]) -> str:
    """`transformers 4.44.0 (requirements.txt), torch 2.13.0 (.venv), ...`."""
    return ", ".join(v.label for v in versions.values())
