/**
 * activate(): the language client it builds, and what it does when settings change. The client
 * library (test/languageclient.fake.ts) and the install probe are stand-ins; the rest is real.
 */
import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import type { ServerCheck } from '../../src/client';
import { activate, deactivate, probe, LlmmemClient } from '../../src/extension';
import { clients, starting } from '../languageclient.fake';
import { spy, waitFor } from '../spy';
import {
  Uri,
  commands,
  configurationChange,
  env,
  fakeDocument,
  fire,
  languages,
  resetMock,
  settingsStore,
  window,
  workspace,
  type FakeTerminal,
} from '../vscode.mock';

const installed: ServerCheck = { ok: true, version: '0.1.0' };
const missing: ServerCheck = { ok: false, reason: 'not-installed', detail: "ModuleNotFoundError: No module named 'llmmem_lsp'" };
const realProbe = { ...probe };
const context = { subscriptions: [] as { dispose(): unknown }[], extensionPath: '' };
type Check = (python: string, timeoutMs?: number, env?: NodeJS.ProcessEnv) => Promise<ServerCheck>;
let check = spy<Check>(async () => installed);
const TAG = { cache_tag: 'cpython-311', platform: 'linux-x86_64' };

/** An extension folder; with `bundle`, carrying libs for `TAG` and the llmmem wheel. */
function extensionFolder(bundle: boolean): string {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'llmmem-extension-'));
  if (bundle) {
    fs.mkdirSync(path.join(root, 'bundled', 'libs'), { recursive: true });
    fs.mkdirSync(path.join(root, 'bundled', 'wheel'), { recursive: true });
    const wheel = 'llmmem-0.1.0-py3-none-any.whl';
    fs.writeFileSync(path.join(root, 'bundled', 'libs', 'llmmem-bundle.json'), JSON.stringify({ ...TAG, wheel }));
    fs.writeFileSync(path.join(root, 'bundled', 'wheel', wheel), '');
  }
  return root;
}

beforeEach(() => {
  resetMock();
  clients.length = 0;
  starting.with = undefined;
  context.subscriptions = [];
  context.extensionPath = extensionFolder(false);
  check = spy<Check>(async () => installed);
  probe.checkServerInstalled = check;
  probe.interpreterTag = async () => TAG;
  settingsStore.defaults.set('llmmem.hub', true);
  settingsStore.defaults.set('llmmem.interpreter', '');
});

afterEach(async () => {
  await deactivate();
  Object.assign(probe, realProbe);
});

function activateExtension(): void {
  activate(context as never);
}

describe('activate', () => {
  it('registers the four commands and starts `<llmmem.interpreter> -m llmmem_lsp`', async () => {
    settingsStore.global.set('llmmem.interpreter', '/opt/llmmem/bin/python');
    settingsStore.global.set('llmmem.gpu', 'RTX-4090');
    activateExtension();
    await waitFor(() => assert.equal(clients[0]?.start.calls.length, 1));
    const registered = commands.registerCommand.calls.map((call) => call[0]);
    for (const command of ['llmmem.verifyActive', 'llmmem.explainActive', 'llmmem.selectGpu', 'llmmem.restart']) {
      assert.ok(registered.includes(command), command);
    }
    // the quick fixes for a GPU setting that names no GPU
    assert.equal(languages.registerCodeActionsProvider.calls.length, 1);
    const client = clients[0]!;
    assert.equal(client.id, 'llmmem');
    assert.equal(client.serverOptions.command, '/opt/llmmem/bin/python');
    assert.deepEqual(client.serverOptions.args, ['-m', 'llmmem_lsp']);
    assert.deepEqual(client.clientOptions.initializationOptions(), {
      gpu: 'RTX-4090',
      worldSize: null,
      hub: true,
      hubTimeoutSeconds: 3,
      severity: {},
      debounceMs: 300,
      analysisTimeoutSeconds: 10,
      detectGpu: true,
      breakdownCommand: 'llmmem.showBreakdown',
    });
    // the step's hover links to the breakdown: that command, and no other, runs from a hover
    assert.deepEqual(client.clientOptions.markdown, {
      isTrusted: { enabledCommands: ['llmmem.showBreakdown'] },
      supportHtml: false,
    });
    assert.ok(registered.includes('llmmem.showBreakdown'));
    assert.ok(
      client.clientOptions.documentSelector.some(
        (filter) => JSON.stringify(filter) === JSON.stringify({ notebook: 'jupyter-notebook', language: 'python' }),
      ),
    );
    assert.equal(typeof client.clientOptions.middleware.workspace.configuration, 'function');
    assert.equal(typeof client.clientOptions.middleware.executeCommand, 'function');
    assert.deepEqual(check.calls[0], ['/opt/llmmem/bin/python']);
  });

  it('restarts the server when llmmem.interpreter changes', async () => {
    activateExtension();
    await waitFor(() => assert.equal(clients[0]?.start.calls.length, 1));
    assert.match(clients[0]!.serverOptions.command, /^python3?$/);
    settingsStore.global.set('llmmem.interpreter', '/envs/other/bin/python');
    await fire('workspace.onDidChangeConfiguration', configurationChange('llmmem.interpreter'));
    await waitFor(() => assert.equal(clients[1]?.start.calls.length, 1));
    assert.equal(clients[0]!.stop.calls.length, 1);
    assert.equal(clients[1]!.serverOptions.command, '/envs/other/bin/python');
  });

  it('tells the running server about other setting changes, without a restart', async () => {
    activateExtension();
    await waitFor(() => assert.equal(clients[0]?.start.calls.length, 1));
    settingsStore.global.set('llmmem.gpu', 'H100');
    await fire('workspace.onDidChangeConfiguration', configurationChange('llmmem.gpu'));
    const client = clients[0]!;
    assert.equal(client.sendNotification.calls.length, 1);
    const [type, params] = client.sendNotification.calls[0]!;
    assert.deepEqual(type, { method: 'workspace/didChangeConfiguration' });
    assert.equal((params as { settings: { llmmem: { gpu: string } } }).settings.llmmem.gpu, 'H100');
    assert.equal(client.stop.calls.length, 0);
    assert.equal(clients.length, 1);
  });

  it('runs the server with the llmmem it carries when the interpreter has none', async () => {
    context.extensionPath = extensionFolder(true);
    settingsStore.global.set('llmmem.interpreter', '/usr/bin/python3');
    check.does(async (_python, _timeout, env) => (env?.PYTHONPATH ? installed : missing));
    activateExtension();
    await waitFor(() => assert.equal(clients[0]?.start.calls.length, 1));
    const libs = path.join(context.extensionPath, 'bundled', 'libs');
    assert.equal(clients[0]!.serverOptions.command, '/usr/bin/python3');
    assert.equal(clients[0]!.serverOptions.options.env.PYTHONPATH?.split(path.delimiter)[0], libs);
    assert.equal(window.showWarningMessage.calls.length + window.showErrorMessage.calls.length, 0);
  });

  it('offers to install the wheel it carries where its libs do not fit the interpreter', async () => {
    context.extensionPath = extensionFolder(true);
    probe.interpreterTag = async () => ({ cache_tag: 'cpython-312', platform: 'darwin-arm64' });
    settingsStore.global.set('llmmem.interpreter', '/envs/bare/bin/python');
    check.does(async () => missing);
    window.showWarningMessage.doesOnce(async () => 'Install llmmem');
    activateExtension();
    await waitFor(() => assert.equal(window.createTerminal.calls.length, 1));
    const terminal = window.createTerminal.results[0] as FakeTerminal;
    const wheel = path.join(context.extensionPath, 'bundled', 'wheel', 'llmmem-0.1.0-py3-none-any.whl');
    assert.deepEqual(terminal.lines, [`/envs/bare/bin/python -m pip install ${wheel}`]);
    assert.equal(terminal.shown, true);
    assert.match(window.showWarningMessage.calls[0]![0], /not installed/);
    assert.equal(clients.length, 0);
  });

  it('names no package to install where it carries none (a build without bundled/)', async () => {
    check.does(async () => missing);
    activateExtension();
    await waitFor(() => assert.equal(window.showWarningMessage.calls.length, 1));
    const [message, ...items] = window.showWarningMessage.calls[0]!;
    assert.match(message, /not installed/);
    assert.ok(!items.includes('Install llmmem'), items.join(', '));
  });

  it('says once why a server that stops at start stopped, with Show Log', async () => {
    window.showErrorMessage.doesOnce(async () => 'Show Log');
    // the process writes its traceback and ends before it answers initialize
    starting.with = async (client) => {
      client.clientOptions.outputChannel!.append('Traceback (most recent call last):\n  File "x.py", line 1\n');
      client.clientOptions.outputChannel!.append("ModuleNotFoundError: No module named 'pygls'\n");
      client.clientOptions.outputChannel!.appendLine('[Error - 10:00:00] Server process exited with code 1.');
      throw new Error('Pending response rejected since connection got disposed');
    };
    activateExtension();
    await waitFor(() => assert.equal(window.showErrorMessage.calls.length, 1), 3_000);
    const client = clients[0]!;
    await new Promise((resolve) => setTimeout(resolve, 400));
    assert.equal(window.showErrorMessage.calls.length + window.showWarningMessage.calls.length, 1);
    const [message, ...items] = window.showErrorMessage.calls[0]!;
    assert.equal(message, "llmmem: the language server stopped at start: ModuleNotFoundError: No module named 'pygls'");
    assert.deepEqual(items, ['Show Log']);
    // it is not restarted over and over
    const closed = await client.clientOptions.errorHandler!.closed();
    assert.deepEqual(closed, { action: 1, handled: true });
  });

  it('a restart after a failed start ends the failed client quietly and says the same cause once', async () => {
    starting.with = async (client) => {
      client.clientOptions.outputChannel!.append('llmmem-lsp: error: this interpreter refuses to start\n');
      throw new Error('Pending response rejected since connection got disposed');
    };
    activateExtension();
    await waitFor(() => assert.equal(window.showErrorMessage.calls.length, 1), 3_000);
    // vscode-languageclient refuses to dispose a client whose start failed
    clients[0]!.dispose.doesOnce(async () => {
      throw new Error("Client is not running and can't be stopped. It's current state is: startFailed");
    });
    const restart = commands.registerCommand.calls.find((call) => call[0] === 'llmmem.restart')![1];
    await restart();
    await waitFor(() => assert.equal(clients[1]?.start.calls.length, 1), 3_000);
    await new Promise((resolve) => setTimeout(resolve, 400));
    const messages = window.showErrorMessage.calls.map((call) => call[0]);
    assert.deepEqual(messages, ['llmmem: the language server stopped at start: llmmem-lsp: error: this interpreter refuses to start']);
  });

  it('says why when start() resolves but the server ended as it started', async () => {
    starting.with = async (client) => {
      client.clientOptions.outputChannel!.append('llmmem-lsp: error: this interpreter refuses to start\n');
      return 'ended';
    };
    activateExtension();
    await waitFor(() => assert.equal(window.showErrorMessage.calls.length, 1), 3_000);
    const [message, ...items] = window.showErrorMessage.calls[0]!;
    assert.equal(message, 'llmmem: the language server stopped at start: llmmem-lsp: error: this interpreter refuses to start');
    assert.deepEqual(items, ['Show Log']);
  });

  it('does not install anything when the user declines', async () => {
    check.doesOnce(async () => ({ ok: false, reason: 'not-installed', detail: "No module named 'llmmem_lsp'" }));
    activateExtension();
    await waitFor(() => assert.equal(window.showWarningMessage.calls.length, 1));
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(window.createTerminal.calls.length, 0);
    assert.equal(clients.length, 0);
  });

  const outputLines = () => (window.createOutputChannel.results[0] as { lines: string[] }).lines;

  for (const [where, set, remote, said] of [
    ['User settings', () => settingsStore.global.set('llmmem.interpreter', '/opt/llmmem/bin/python'), undefined, 'User settings'],
    ['Workspace settings', () => settingsStore.workspace.set('llmmem.interpreter', '/opt/llmmem/bin/python'), undefined, 'Workspace settings'],
    [
      'a remote window',
      () => settingsStore.global.set('llmmem.interpreter', '/opt/llmmem/bin/python'),
      'ssh-remote',
      'User or Remote [ssh-remote] settings',
    ],
  ] as const) {
    it(`says in the output channel where llmmem.interpreter was read from (${where})`, async () => {
      set();
      env.remoteName = remote;
      activateExtension();
      await waitFor(() => assert.equal(clients[0]?.start.calls.length, 1));
      assert.ok(
        outputLines().includes(`interpreter: /opt/llmmem/bin/python (from setting, llmmem.interpreter read from ${said})`),
        outputLines().join('\n'),
      );
    });
  }

  it('leaves the diagnostic collection name to the server (no second collection named llmmem)', async () => {
    activateExtension();
    await waitFor(() => assert.equal(clients[0]?.start.calls.length, 1));
    const options = clients[0]!.clientOptions as { diagnosticCollectionName?: string };
    assert.equal(options.diagnosticCollectionName, undefined);
  });

  it('logs a normal end of the server process as info, any other end as an error', async () => {
    activateExtension();
    await waitFor(() => assert.equal(clients[0]?.start.calls.length, 1));
    const client = clients[0]!;
    assert.ok(client instanceof LlmmemClient);
    client.error('Server process exited with code 0.');
    client.error('Server process exited with code 1.');
    client.error("llmmem client: couldn't create connection to server.", undefined, 'force');
    assert.deepEqual(client.logged, [
      { level: 'info', message: 'Server process exited normally (code 0).', notify: false },
      { level: 'error', message: 'Server process exited with code 1.', notify: true },
      // a failed start: the controller's message says it, with the cause
      { level: 'error', message: "llmmem client: couldn't create connection to server.", notify: false },
    ]);
  });

  describe('an open Explain report', () => {
    const answerOn = (gpu: string) => ({ uri: 'file:///work/train.py', markdown: `**≈ 25.4 GiB on ${gpu}**`, budget: null });
    let gpu = 'RTX-4090';

    async function explainTrainPy(): Promise<{ provideTextDocumentContent(uri: unknown): string; uri: unknown }> {
      const file = fakeDocument('/work/train.py');
      workspace.textDocuments = [file];
      window.activeTextEditor = { document: file };
      activateExtension();
      await waitFor(() => assert.equal(clients[0]?.start.calls.length, 1));
      clients[0]!.sendRequest.does(async (_type, params) =>
        (params as { command: string }).command === 'llmmem.explain' ? answerOn(gpu) : undefined,
      );
      const explain = commands.registerCommand.calls.find((call) => call[0] === 'llmmem.explainActive')![1];
      await explain();
      const provider = workspace.registerTextDocumentContentProvider.calls[0]![1] as {
        provideTextDocumentContent(uri: unknown): string;
      };
      const shown = commands.executeCommand.calls.find((call) => call[0] === 'markdown.showPreviewToSide')!;
      return { provideTextDocumentContent: (uri) => provider.provideTextDocumentContent(uri), uri: shown[1] };
    }

    beforeEach(() => {
      gpu = 'RTX-4090';
    });

    it('follows a GPU setting change', async () => {
      const report = await explainTrainPy();
      assert.match(report.provideTextDocumentContent(report.uri), /on RTX-4090/);
      gpu = 'A100-80GB';
      settingsStore.global.set('llmmem.gpu', 'A100-80GB');
      await fire('workspace.onDidChangeConfiguration', configurationChange('llmmem.gpu'));
      await waitFor(() => assert.match(report.provideTextDocumentContent(report.uri), /on A100-80GB/), 3_000);
    });

    it("follows new diagnostics of its file", async () => {
      const report = await explainTrainPy();
      gpu = 'H100';
      await fire('languages.onDidChangeDiagnostics', { uris: [Uri.file('/work/train.py')] });
      await waitFor(() => assert.match(report.provideTextDocumentContent(report.uri), /on H100/), 2_000);
    });
  });
});
