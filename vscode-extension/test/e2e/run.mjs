#!/usr/bin/env node
// End-to-end test: the packaged extension in a real VS Code (code-server from the npm registry),
// driven by Debian's chromium through puppeteer-core, on examples/qlora_sft.py.
//
//   npm run test:e2e
//
// Environment: LLMMEM_PYTHON (the Python that has llmmem; default ../.venv/bin/python),
// LLMMEM_E2E_CACHE (installs, default ~/.cache/llmmem-vscode-e2e), LLMMEM_E2E_ARTIFACTS
// (screenshots and logs, default test/e2e/artifacts/), LLMMEM_E2E_VSIX (a built .vsix; default:
// the newest llmmem-*.vsix here, packaged again when the sources are newer; it carries llmmem in
// bundled/), LLMMEM_E2E_CHROMIUM.
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import {
  NODE_MAJOR,
  SetupError,
  cacheDir,
  chromiumPath,
  ensureCodeServer,
  ensureNode,
  ensurePuppeteer,
  ensureSystemPackages,
  log,
  nodeEnv,
  run,
} from './setup.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const EXTENSION_ROOT = path.resolve(HERE, '..', '..');
const REPO_ROOT = path.resolve(EXTENSION_ROOT, '..');
const TOTAL_LIMIT_MS = 20 * 60_000;

function artifactsDir() {
  return path.resolve(process.env.LLMMEM_E2E_ARTIFACTS || path.join(HERE, 'artifacts'));
}

function newestMtime(target) {
  const stat = fs.statSync(target);
  if (!stat.isDirectory()) {
    return stat.mtimeMs;
  }
  return Math.max(0, ...fs.readdirSync(target).map((name) => newestMtime(path.join(target, name))));
}

/** The .vsix to install: LLMMEM_E2E_VSIX, else a fresh enough llmmem-*.vsix, else packaged now. */
async function vsixPath(env) {
  if (process.env.LLMMEM_E2E_VSIX) {
    return path.resolve(process.env.LLMMEM_E2E_VSIX);
  }
  const built = fs
    .readdirSync(EXTENSION_ROOT)
    .filter((name) => /^llmmem-.*\.vsix$/.test(name))
    .map((name) => path.join(EXTENSION_ROOT, name))
    .sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs)[0];
  const sources = Math.max(
    newestMtime(path.join(EXTENSION_ROOT, 'src')),
    newestMtime(path.join(EXTENSION_ROOT, 'package.json')),
    newestMtime(path.join(REPO_ROOT, 'server', 'llmmem_lsp')),
    newestMtime(path.join(REPO_ROOT, 'analyzer', 'llmmem')),
  );
  if (built && fs.statSync(built).mtimeMs >= sources) {
    return built;
  }
  log('packaging the extension (npx @vscode/vsce package)');
  await run('npx', ['@vscode/vsce', 'package', '--allow-missing-repository'], {
    env,
    cwd: EXTENSION_ROOT,
    timeoutMs: 300_000,
  });
  return vsixPath(env);
}

function pythonPath() {
  const python = path.resolve(process.env.LLMMEM_PYTHON || path.join(REPO_ROOT, '.venv', 'bin', 'python'));
  const probe = spawnSync(python, ['-c', 'import llmmem_lsp, llmmem; print(llmmem.__version__)'], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  if (probe.status !== 0) {
    throw new SetupError(
      `${python} cannot import llmmem_lsp (set LLMMEM_PYTHON to the Python that has llmmem): ` +
        `${(probe.stderr || probe.error?.message || '').trim().split('\n').pop()}`,
    );
  }
  return python;
}

/** Two interpreters for the start paths: a bare one (a venv of `python`'s base, without
 * llmmem: the extension runs it with the llmmem it carries) and one that refuses to run the
 * server (`-m llmmem_lsp` ends at once with a line on stderr: the message must say it). */
function startInterpreters(python, scratch) {
  const bare = path.join(scratch, 'bare-python');
  const made = spawnSync(python, ['-m', 'venv', '--without-pip', bare], { encoding: 'utf8', timeout: 60_000 });
  if (made.status !== 0) {
    throw new SetupError(`cannot make a bare venv with ${python}: ${made.stderr}`);
  }
  const failing = path.join(scratch, 'failing-python');
  fs.writeFileSync(
    failing,
    '#!/bin/sh\n' +
      'if [ "$1" = "-m" ] && [ "$2" = "llmmem_lsp" ]; then\n' +
      '  echo "llmmem-lsp: error: this interpreter refuses to start the server (the end-to-end test)" >&2\n' +
      '  exit 3\n' +
      'fi\n' +
      `exec '${python}' "$@"\n`,
  );
  fs.chmodSync(failing, 0o755);
  return { bare: path.join(bare, 'bin', 'python'), failing };
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

async function waitForHealth(url, child, timeoutMs) {
  const started = Date.now();
  while (Date.now() - started < timeoutMs) {
    if (child.exitCode !== null) {
      throw new SetupError(`code-server exited with code ${child.exitCode} before it answered`);
    }
    try {
      const answer = await fetch(url, { signal: AbortSignal.timeout(2_000) });
      if (answer.ok) {
        return;
      }
    } catch {
      // not listening yet
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new SetupError(`code-server did not answer ${url} within ${timeoutMs / 1000} s`);
}

function writeJson(file, value) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, JSON.stringify(value, null, 2) + '\n');
}

/** Copies the output channel and extension host logs of the run into the artifacts. */
function collectLogs(userData, artifacts) {
  const logs = path.join(userData, 'logs');
  if (!fs.existsSync(logs)) {
    return;
  }
  const walk = (dir) =>
    fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
      const full = path.join(dir, entry.name);
      return entry.isDirectory() ? walk(full) : [full];
    });
  for (const file of walk(logs)) {
    const name = path.basename(file);
    if (/llmmem\.log$/.test(name) || name === 'remoteexthost.log' || name === 'exthost.log') {
      fs.copyFileSync(file, path.join(artifacts, name.replace(/^\d+-/, '')));
    }
  }
}

async function main() {
  const started = Date.now();
  const cache = cacheDir();
  fs.mkdirSync(cache, { recursive: true });
  await ensureSystemPackages(cache);
  const nodeDir = await ensureNode(cache);
  if (process.versions.node.split('.')[0] !== NODE_MAJOR) {
    // the rest runs on node 24 (code-server needs it, and so does puppeteer-core)
    const node = path.join(nodeDir, 'bin', 'node');
    log(`continuing on ${node}`);
    const child = spawn(node, [fileURLToPath(import.meta.url), ...process.argv.slice(2)], {
      env: { ...process.env, LLMMEM_E2E_STARTED: String(started) },
      stdio: 'inherit',
    });
    for (const signal of ['SIGINT', 'SIGTERM']) {
      process.on(signal, () => child.kill(signal));
    }
    const code = await new Promise((resolve) => child.on('exit', (c, s) => resolve(c ?? (s ? 1 : 0))));
    process.exit(code);
  }
  const env = nodeEnv(nodeDir);
  const codeServer = await ensureCodeServer(cache, nodeDir);
  const puppeteerModule = await ensurePuppeteer(cache, nodeDir);
  const chromium = chromiumPath();
  const python = pythonPath();
  const vsix = await vsixPath(env);

  const artifacts = artifactsDir();
  fs.rmSync(artifacts, { recursive: true, force: true });
  fs.mkdirSync(artifacts, { recursive: true });
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'llmmem-e2e-'));
  const userData = path.join(scratch, 'user-data');
  const extensions = path.join(scratch, 'extensions');
  const workspace = path.join(scratch, 'workspace');
  fs.mkdirSync(workspace, { recursive: true });
  fs.copyFileSync(path.join(REPO_ROOT, 'examples', 'qlora_sft.py'), path.join(workspace, 'qlora_sft.py'));
  fs.copyFileSync(path.join(REPO_ROOT, 'examples', 'qlora_sft.py'), path.join(workspace, 'qlora_sft.orig'));
  const settings = {
    'llmmem.interpreter': python,
    'llmmem.gpu': 'RTX-4090',
    'llmmem.hub': false,
    'llmmem.detectGpu': false,
    'workbench.startupEditor': 'none',
    'workbench.tips.enabled': false,
    'workbench.enableExperiments': false,
    'security.workspace.trust.enabled': false,
    'extensions.autoCheckUpdates': false,
    'extensions.autoUpdate': false,
    'update.mode': 'none',
    'telemetry.telemetryLevel': 'off',
    'editor.hover.delay': 200,
    'editor.minimap.enabled': false,
    'window.restoreWindows': 'none',
    'files.autoSave': 'off',
    'chat.disableAIFeatures': true,
    'workbench.secondarySideBar.defaultVisibility': 'hidden',
  };
  writeJson(path.join(userData, 'User', 'settings.json'), settings);
  writeJson(path.join(userData, 'Machine', 'settings.json'), { 'llmmem.interpreter': python });
  const serverEnv = {
    ...env,
    HOME: scratch,
    XDG_CONFIG_HOME: path.join(scratch, 'config'),
    XDG_DATA_HOME: path.join(scratch, 'data'),
    XDG_CACHE_HOME: path.join(scratch, 'cache'),
  };
  const common = ['--user-data-dir', userData, '--extensions-dir', extensions, '--config', path.join(scratch, 'config.yaml')];
  fs.writeFileSync(path.join(scratch, 'config.yaml'), 'auth: none\n');
  log(`installing ${path.basename(vsix)} into code-server`);
  await run(codeServer, [...common, '--install-extension', vsix], {
    env: serverEnv,
    timeoutMs: 120_000,
    logFile: path.join(artifacts, 'install-extension.log'),
  });

  const port = await freePort();
  const serverLog = fs.openSync(path.join(artifacts, 'code-server.log'), 'a');
  log(`starting code-server on 127.0.0.1:${port}`);
  const server = spawn(
    codeServer,
    [
      ...common,
      '--bind-addr',
      `127.0.0.1:${port}`,
      '--auth',
      'none',
      '--disable-telemetry',
      '--disable-update-check',
      '--disable-workspace-trust',
      '--disable-getting-started-override',
      workspace,
    ],
    { env: serverEnv, stdio: ['ignore', serverLog, serverLog], detached: true },
  );
  let browser;
  const stopAll = async () => {
    if (browser) {
      const closing = browser.close().catch(() => undefined);
      const proc = browser.process();
      await Promise.race([closing, new Promise((resolve) => setTimeout(resolve, 5_000))]);
      if (proc && proc.exitCode === null) {
        proc.kill('SIGKILL');
      }
      browser = undefined;
    }
    if (server.exitCode === null && server.signalCode === null) {
      try {
        process.kill(-server.pid, 'SIGTERM');
      } catch {
        // gone already
      }
      const exited = await Promise.race([
        new Promise((resolve) => server.once('exit', () => resolve(true))),
        new Promise((resolve) => setTimeout(() => resolve(false), 5_000)),
      ]);
      if (!exited) {
        try {
          process.kill(-server.pid, 'SIGKILL');
        } catch {
          // gone already
        }
      }
    }
  };
  const onSignal = (signal) => {
    log(`${signal}: stopping code-server and chromium`);
    void stopAll().then(() => process.exit(1));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const total = Number(process.env.LLMMEM_E2E_STARTED || started);
  const overall = setTimeout(() => {
    log(`the test ran past ${TOTAL_LIMIT_MS / 60_000} minutes: stopping`);
    void stopAll().then(() => process.exit(1));
  }, Math.max(60_000, TOTAL_LIMIT_MS - (Date.now() - total)));
  try {
    await waitForHealth(`http://127.0.0.1:${port}/healthz`, server, 60_000);
    const puppeteer = (await import(pathToFileURL(puppeteerModule).href)).default;
    browser = await puppeteer.launch({
      executablePath: chromium,
      headless: true,
      args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu', '--window-size=1400,900'],
      defaultViewport: { width: 1400, height: 900 },
      protocolTimeout: 60_000,
    });
    const { scenario } = await import('./scenario.mjs');
    await scenario({
      browser,
      url: `http://127.0.0.1:${port}/?folder=${encodeURIComponent(workspace)}`,
      workspace,
      artifacts,
      userData,
      python,
      interpreters: startInterpreters(python, scratch),
    });
    log(`passed in ${Math.round((Date.now() - total) / 1000)} s; screenshots in ${artifacts}`);
  } finally {
    clearTimeout(overall);
    await stopAll();
    collectLogs(userData, artifacts);
    fs.closeSync(serverLog);
    fs.rmSync(scratch, { recursive: true, force: true });
  }
}

main().catch((error) => {
  if (error instanceof SetupError) {
    console.error(`e2e: ${error.message}`);
  } else {
    console.error(`e2e: FAILED: ${error && error.stack ? error.stack : String(error)}`);
  }
  process.exit(1);
});
