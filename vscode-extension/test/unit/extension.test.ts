/**
 * activate(): the language client it builds, and what it does when settings change. The client
 * library (test/languageclient.fake.ts) and the install probe are stand-ins; the rest is real.
 */
import { strict as assert } from 'node:assert';

import type { ServerCheck } from '../../src/client';
import { activate, deactivate, probe, LlmmemClient } from '../../src/extension';
import { clients } from '../languageclient.fake';
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
const realProbe = probe.checkServerInstalled;
const context = { subscriptions: [] as { dispose(): unknown }[] };
let check = spy(async (_python: string, _timeoutMs?: number): Promise<ServerCheck> => installed);

beforeEach(() => {
  resetMock();
  clients.length = 0;
  context.subscriptions = [];
  check = spy(async (_python: string, _timeoutMs?: number): Promise<ServerCheck> => installed);
  probe.checkServerInstalled = check;
  settingsStore.defaults.set('llmmem.hub', true);
  settingsStore.defaults.set('llmmem.interpreter', '');
});

afterEach(async () => {
  await deactivate();
  probe.checkServerInstalled = realProbe;
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
    });
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

  it('offers to install llmmem with pip in a terminal when it is missing', async () => {
    settingsStore.global.set('llmmem.interpreter', '/envs/bare/bin/python');
    check.doesOnce(async () => ({
      ok: false,
      reason: 'not-installed',
      detail: "ModuleNotFoundError: No module named 'llmmem_lsp'",
    }));
    window.showWarningMessage.doesOnce(async () => 'Install llmmem');
    activateExtension();
    await waitFor(() => assert.equal(window.createTerminal.calls.length, 1));
    const terminal = window.createTerminal.results[0] as FakeTerminal;
    assert.deepEqual(terminal.lines, ['/envs/bare/bin/python -m pip install llmmem']);
    assert.equal(terminal.shown, true);
    assert.match(window.showWarningMessage.calls[0]![0], /not installed/);
    assert.equal(clients.length, 0);
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
    assert.deepEqual(client.logged, [
      { level: 'info', message: 'Server process exited normally (code 0).' },
      { level: 'error', message: 'Server process exited with code 1.' },
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
