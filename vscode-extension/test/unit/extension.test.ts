/**
 * activate(): the language client it builds, and what it does when settings change. The client
 * library (test/languageclient.fake.ts) and the install probe are stand-ins; the rest is real.
 */
import { strict as assert } from 'node:assert';

import type { ServerCheck } from '../../src/client';
import { activate, deactivate, probe } from '../../src/extension';
import { clients } from '../languageclient.fake';
import { spy, waitFor } from '../spy';
import { commands, configurationChange, fire, resetMock, settingsStore, window, type FakeTerminal } from '../vscode.mock';

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
});
