#!/usr/bin/env node
// Puts llmmem and the Python packages it needs into bundled/ for the .vsix, as Microsoft's
// Python tool extensions carry theirs: bundled/libs (on the server's import path when the chosen
// interpreter has no llmmem) and bundled/wheel/llmmem-*.whl (what "Install llmmem" installs).
//
//   node scripts/bundle-python.mjs        (npm run bundle-python; vscode:prepublish runs it)
//
// Python: LLMMEM_PYTHON, else ../.venv/bin/python, else python3. The libs hold compiled
// packages (pydantic-core, libcst, PyYAML) for that interpreter's version and platform, written
// to bundled/libs/llmmem-bundle.json; the extension uses them only with a matching interpreter.
// LLMMEM_BUNDLE_PYTHON=0 leaves bundled/ out (the extension then offers the install only).
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const EXTENSION_ROOT = path.resolve(HERE, '..');
const REPO_ROOT = path.resolve(EXTENSION_ROOT, '..');
const BUNDLED = path.join(EXTENSION_ROOT, 'bundled');
const LIBS = path.join(BUNDLED, 'libs');
const WHEEL_DIR = path.join(BUNDLED, 'wheel');
// kept out of libs: what the server never runs (console scripts, caches) and hf_xet, the Hub's
// large-file transfer (11 MiB compiled; the server reads a model's config.json, which
// huggingface_hub fetches over HTTP without it)
const PRUNED = [/^bin$/, /__pycache__$/, /^hf_xet(-[^/]*\.dist-info)?$/];

function python() {
  if (process.env.LLMMEM_PYTHON) {
    return process.env.LLMMEM_PYTHON;
  }
  const venv = path.join(REPO_ROOT, '.venv', 'bin', 'python');
  return fs.existsSync(venv) ? venv : 'python3';
}

function run(command, args, options = {}) {
  const result = spawnSync(command, args, { stdio: 'inherit', ...options });
  if (result.status !== 0) {
    console.error(`bundle-python: ${command} ${args.join(' ')} failed (${result.error?.message ?? `exit ${result.status}`})`);
    process.exit(1);
  }
  return result;
}

function prune(dir) {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    const relative = path.relative(LIBS, full);
    if (PRUNED.some((pattern) => pattern.test(relative) || pattern.test(entry.name))) {
      fs.rmSync(full, { recursive: true, force: true });
    } else if (entry.isDirectory()) {
      prune(full);
    }
  }
}

function sizeOf(dir) {
  let total = 0;
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    total += entry.isDirectory() ? sizeOf(full) : fs.statSync(full).size;
  }
  return total;
}

fs.rmSync(BUNDLED, { recursive: true, force: true });
if (process.env.LLMMEM_BUNDLE_PYTHON === '0') {
  console.log('bundle-python: LLMMEM_BUNDLE_PYTHON=0, nothing bundled');
  process.exit(0);
}
const py = python();
const env = { ...process.env, PIP_DISABLE_PIP_VERSION_CHECK: '1', PYTHONDONTWRITEBYTECODE: '1' };
// built from a copy of the sources: setuptools writes build/ and *.egg-info beside them
const sources = fs.mkdtempSync(path.join(os.tmpdir(), 'llmmem-wheel-'));
for (const entry of ['pyproject.toml', 'README.md', 'LICENSE', 'analyzer', 'server']) {
  const from = path.join(REPO_ROOT, entry);
  if (fs.existsSync(from)) {
    fs.cpSync(from, path.join(sources, entry), {
      recursive: true,
      filter: (file) => !/(__pycache__|\.egg-info)$/.test(file),
    });
  }
}
try {
  run(py, ['-m', 'pip', 'wheel', '--quiet', '--no-deps', '--no-build-isolation', '--wheel-dir', WHEEL_DIR, sources], { env });
} finally {
  fs.rmSync(sources, { recursive: true, force: true });
}
const wheel = fs.readdirSync(WHEEL_DIR).find((name) => /^llmmem-.*\.whl$/.test(name));
if (!wheel) {
  console.error('bundle-python: pip wrote no llmmem wheel');
  process.exit(1);
}
run(py, ['-m', 'pip', 'install', '--quiet', '--no-compile', '--only-binary', ':all:', '--target', LIBS, path.join(WHEEL_DIR, wheel)], { env });
prune(LIBS);
const tag = spawnSync(
  py,
  ['-c', 'import json, sys, sysconfig; print(json.dumps({"cache_tag": sys.implementation.cache_tag, "platform": sysconfig.get_platform()}))'],
  { encoding: 'utf8' },
);
if (tag.status !== 0) {
  console.error(`bundle-python: cannot ask ${py} for its version: ${tag.stderr}`);
  process.exit(1);
}
const stamp = { ...JSON.parse(tag.stdout), wheel };
fs.writeFileSync(path.join(LIBS, 'llmmem-bundle.json'), JSON.stringify(stamp, null, 2) + '\n');
console.log(`bundle-python: ${wheel} and its packages for ${stamp.cache_tag} ${stamp.platform}, ${(sizeOf(BUNDLED) / 2 ** 20).toFixed(1)} MiB`);
