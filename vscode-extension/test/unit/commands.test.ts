import { strict as assert } from 'node:assert';
import * as vscode from 'vscode';

import {
  Explanations,
  explainActive,
  forgetWorkingDocument,
  gpuSettingTarget,
  selectGpu,
  verifyActive,
} from '../../src/commands';
import { explanationMarkdown } from '../../src/report';
import { StatusBar } from '../../src/statusBar';
import { spy } from '../spy';
import {
  Uri,
  cancelProgress,
  commands,
  configurationUpdates,
  fakeDocument,
  progressReports,
  resetMock,
  settingsStore,
  window,
  workspace,
  type FakeStatusBarItem,
} from '../vscode.mock';

const CATALOG = [
  { name: 'A100-80GB', memoryGiB: 80, bf16: true },
  { name: 'RTX-4090', memoryGiB: 24, bf16: true },
  { name: 'T4', memoryGiB: 15, bf16: false },
];

function fakeServer(answers: Record<string, unknown> = {}) {
  const executeCommand = spy(async (command: string, _args: unknown[]) => answers[command]);
  return { executeCommand: executeCommand as typeof executeCommand & (<T>(c: string, a: unknown[]) => Promise<T | undefined>) };
}

const log = { lines: [] as string[], appendLine: (line: string) => void log.lines.push(line) };

interface GpuItem {
  label: string;
  description: string;
  gpu: string | null;
}

beforeEach(() => {
  resetMock();
  forgetWorkingDocument();
  log.lines = [];
});

describe('Select GPU', () => {
  it('lists the catalog and writes the pick to llmmem.gpu', async () => {
    workspace.workspaceFolders = [{ uri: Uri.file('/work'), name: 'work', index: 0 }];
    window.showQuickPick.does(async (items) => (items as GpuItem[]).find((item) => item.label === 'RTX-4090'));
    const server = fakeServer({ 'llmmem.gpus': CATALOG });
    assert.equal(await selectGpu(server), 'RTX-4090');
    assert.deepEqual(server.executeCommand.calls, [['llmmem.gpus', []]]);
    const items = window.showQuickPick.calls[0]![0] as GpuItem[];
    assert.deepEqual(
      items.map((item) => item.label),
      ['$(search) No GPU setting', 'A100-80GB', 'RTX-4090', 'T4'],
    );
    assert.equal(items[3]!.description, '15 GiB · no bf16');
    assert.deepEqual(configurationUpdates, [
      { key: 'llmmem.gpu', value: 'RTX-4090', target: vscode.ConfigurationTarget.Workspace },
    ]);
  });

  it('clears the setting where it was set', async () => {
    settingsStore.global.set('llmmem.gpu', 'H100');
    window.showQuickPick.does(async (items) => items[0]);
    assert.equal(await selectGpu(fakeServer({ 'llmmem.gpus': CATALOG })), null);
    assert.equal(settingsStore.global.has('llmmem.gpu'), false);
    assert.equal(configurationUpdates[0]?.target, vscode.ConfigurationTarget.Global);
  });

  it('keeps the picker open when the focus moves (a preview rendering beside the file takes it)', async () => {
    await selectGpu(fakeServer({ 'llmmem.gpus': CATALOG }));
    const options = window.showQuickPick.calls[0]![1] as { ignoreFocusOut?: boolean };
    assert.equal(options.ignoreFocusOut, true);
  });

  it('shows no Markdown syntax in the picker (a quick pick renders none)', async () => {
    await selectGpu(fakeServer({ 'llmmem.gpus': CATALOG }));
    const items = window.showQuickPick.calls[0]![0] as (GpuItem & { detail?: string })[];
    for (const item of items) {
      for (const text of [item.label, item.description, item.detail ?? '']) {
        assert.ok(!text.includes('`'), text);
      }
    }
  });

  it('writes a name it is given (a quick fix) without the picker', async () => {
    settingsStore.global.set('llmmem.gpu', 'A10O-80GB');
    const server = fakeServer({ 'llmmem.gpus': CATALOG });
    assert.equal(await selectGpu(server, 'A100-80GB'), 'A100-80GB');
    assert.equal(window.showQuickPick.calls.length, 0);
    assert.deepEqual(server.executeCommand.calls, []);
    assert.equal(settingsStore.global.get('llmmem.gpu'), 'A100-80GB'); // where it was set
  });

  it('writes nothing when the pick is cancelled', async () => {
    assert.equal(await selectGpu(fakeServer({ 'llmmem.gpus': CATALOG })), undefined);
    assert.deepEqual(configurationUpdates, []);
  });

  it('asks for a name when the server is not running', async () => {
    window.showInputBox.does(async () => ' L40S ');
    assert.equal(await selectGpu(fakeServer()), 'L40S');
    assert.equal(settingsStore.global.get('llmmem.gpu'), 'L40S');
  });

  it('keeps the setting at the level that has it', () => {
    assert.equal(gpuSettingTarget({ workspaceValue: 'A100' }, true), vscode.ConfigurationTarget.Workspace);
    assert.equal(gpuSettingTarget({ globalValue: 'A100' }, true), vscode.ConfigurationTarget.Global);
    assert.equal(gpuSettingTarget({}, true), vscode.ConfigurationTarget.Workspace);
    assert.equal(gpuSettingTarget({}, false), vscode.ConfigurationTarget.Global);
  });
});

describe('Verify on GPU', () => {
  it('is refused in an untrusted workspace, with a message and no server call', async () => {
    workspace.isTrusted = false;
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    const server = fakeServer({ 'llmmem.verify': { ok: true, message: 'ok' } });
    assert.equal(await verifyActive(server, log), undefined);
    assert.equal(server.executeCommand.calls.length, 0);
    assert.equal(window.showWarningMessage.calls.length, 1);
    assert.match(window.showWarningMessage.calls[0]![0], /untrusted workspace/);
  });

  it('runs llmmem.verify on the active file in a trusted workspace', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    const server = fakeServer({ 'llmmem.verify': { ok: true, message: 'measured 21.0 GiB' } });
    assert.deepEqual(await verifyActive(server, log), { ok: true, message: 'measured 21.0 GiB' });
    assert.deepEqual(server.executeCommand.calls, [['llmmem.verify', ['file:///work/train.py']]]);
    assert.ok(log.lines.includes('verify: measured 21.0 GiB'));
  });

  it("runs in a notification with Cancel, reporting the server's progress", async () => {
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    const executeWithProgress = spy(
      async (_command: string, _args: unknown[], report: (message: string) => void, _cancel: unknown) => {
        report('building the model from its config');
        report('step 1 of 1');
        return { ok: true, message: 'measured 21.0 GiB' };
      },
    );
    const server = { ...fakeServer(), executeWithProgress } as never;
    assert.deepEqual(await verifyActive(server, log), { ok: true, message: 'measured 21.0 GiB' });
    const [options] = window.withProgress.calls[0]!;
    assert.deepEqual(options, { location: 15, title: 'llmmem: verifying train.py on the GPU', cancellable: true });
    assert.deepEqual(progressReports, [['building the model from its config', 'step 1 of 1']]);
    assert.deepEqual(executeWithProgress.calls[0]!.slice(0, 2), ['llmmem.verify', ['file:///work/train.py']]);
    // the client reported on its own progress: the outcome is the extension's to say
    assert.equal(window.showInformationMessage.calls[0]![0], 'llmmem: measured 21.0 GiB');
  });

  it('stops when the notification is cancelled (the request is cancelled)', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    const executeWithProgress = spy(
      (_command: string, _args: unknown[], _report: unknown, cancel: { onCancellationRequested(l: () => void): unknown }) =>
        new Promise((_resolve, reject) => {
          cancel.onCancellationRequested(() => reject(Object.assign(new Error('Request cancelled'), { code: -32800 })));
        }),
    );
    const server = { ...fakeServer(), executeWithProgress } as never;
    const running = verifyActive(server, log);
    await new Promise((resolve) => setTimeout(resolve, 10));
    cancelProgress();
    assert.deepEqual(await running, { ok: false, cancelled: true, message: 'verify cancelled' });
    assert.equal(window.showWarningMessage.calls.length, 0);
  });

  it('says in the log that a verify was cancelled when the server answers the cancel itself', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    // the server ended the run and answered before the client saw its cancellation
    const executeWithProgress = spy(
      (_command: string, _args: unknown[], _report: unknown, cancel: { onCancellationRequested(l: () => void): unknown }) =>
        new Promise((resolve) => {
          cancel.onCancellationRequested(() => resolve({ ok: false, cancelled: true, message: 'verify cancelled' }));
        }),
    );
    const server = { ...fakeServer(), executeWithProgress } as never;
    const running = verifyActive(server, log);
    await new Promise((resolve) => setTimeout(resolve, 10));
    cancelProgress();
    assert.deepEqual(await running, { ok: false, cancelled: true, message: 'verify cancelled' });
    assert.ok(log.lines.includes('verify cancelled'), log.lines.join('\n'));
    assert.equal(window.showWarningMessage.calls.length, 0);
  });

  it('does not offer a simulated step where none can run the plan, and says why', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/qlora.py') };
    const why = 'its k-bit layers are bitsandbytes kernels, which do not run on fake tensors';
    const server = fakeServer({
      'llmmem.verify': {
        ok: false,
        message: 'no CUDA device here: run `llmmem verify FILE --simulate` ...',
        simulate: { possible: false, why },
      },
    });
    await verifyActive(server, log);
    assert.equal(server.executeCommand.calls.length, 1);
    assert.ok(!window.showInformationMessage.calls.some((call) => call.includes('Simulate instead')));
    assert.equal(
      window.showWarningMessage.calls[0]![0],
      `llmmem: no GPU here to verify on, and a simulated step cannot run this plan: ${why}.`,
    );
  });

  it('offers a simulated step when the server has no CUDA device and the plan can be simulated', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    const answers: unknown[] = [
      {
        ok: false,
        message: 'no measurement: no CUDA device here: run `llmmem verify FILE --simulate` ...',
        simulate: { possible: true },
      },
      { ok: true, message: 'simulated: 21.0 GiB allocated at its peak' },
    ];
    const executeCommand = spy(async (_command: string, _args: unknown[]) => answers.shift());
    const server = { executeCommand: executeCommand as typeof executeCommand & (<T>(c: string, a: unknown[]) => Promise<T | undefined>) };
    window.showInformationMessage.doesOnce(async () => 'Simulate instead');
    assert.deepEqual(await verifyActive(server, log), {
      ok: true,
      message: 'simulated: 21.0 GiB allocated at its peak',
    });
    assert.deepEqual(executeCommand.calls, [
      ['llmmem.verify', ['file:///work/train.py']],
      ['llmmem.verify', ['file:///work/train.py', { simulate: true }]],
    ]);
  });

  it('saves a modified file first, when the user agrees', async () => {
    const document = { ...fakeDocument('/work/train.py'), isDirty: true, save: spy(async () => true) };
    workspace.textDocuments = [document];
    window.activeTextEditor = { document };
    window.showInformationMessage.doesOnce(async () => 'Save and Verify');
    const server = fakeServer({ 'llmmem.verify': { ok: true, message: 'ok' } });
    await verifyActive(server, log);
    assert.equal(document.save.calls.length, 1);
    assert.equal(server.executeCommand.calls.length, 1);
  });

  it('verifies a notebook by its notebook URI', async () => {
    window.activeNotebookEditor = { notebook: { uri: Uri.file('/work/train.ipynb'), notebookType: 'jupyter-notebook' } };
    window.activeTextEditor = { document: fakeDocument('/work/train.ipynb', 'python', 'vscode-notebook-cell') };
    const server = fakeServer({ 'llmmem.verify': { ok: true, message: 'ok' } });
    await verifyActive(server, log);
    assert.deepEqual(server.executeCommand.calls, [['llmmem.verify', ['file:///work/train.ipynb']]]);
  });
});

describe('Explain', () => {
  it('shows the report in a Markdown preview', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    const answer = {
      uri: 'file:///work/train.py',
      markdown: '**≈ 25.4 GiB of 24.0 GiB on RTX-4090**',
      findings: [{ code: 'LLM001', severity: 'error', message: 'Will not fit RTX-4090' }],
      budget: null,
    };
    const explanations = new Explanations();
    await explainActive(fakeServer({ 'llmmem.explain': answer }), explanations);
    const [command, uri] = commands.executeCommand.calls[0]!;
    assert.equal(command, 'markdown.showPreviewToSide');
    const text = explanations.provideTextDocumentContent(uri as vscode.Uri);
    assert.equal(text, explanationMarkdown(answer));
    assert.match(text, /^# llmmem: train\.py$/m);
    assert.match(text, /^- \*\*LLM001\*\* \(error\): Will not fit RTX-4090$/m);
  });

  const onGpu = (gpu: string) => ({
    uri: 'file:///work/train.py',
    markdown: `**≈ 25.4 GiB on ${gpu}**`,
    budget: null,
  });

  it('asks the server again on refresh and updates the open report (a new GPU)', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    const explanations = new Explanations();
    await explainActive(fakeServer({ 'llmmem.explain': onGpu('RTX-4090') }), explanations);
    const report = commands.executeCommand.calls[0]![1] as vscode.Uri;
    const changed: string[] = [];
    explanations.onDidChange((uri) => changed.push(uri.toString()));
    const server = fakeServer({ 'llmmem.explain': onGpu('A100-80GB') });
    await explanations.refresh(server);
    assert.deepEqual(server.executeCommand.calls, [['llmmem.explain', ['file:///work/train.py']]]);
    assert.match(explanations.provideTextDocumentContent(report), /on A100-80GB/);
    assert.deepEqual(changed, [report.toString()]);
    await explanations.refresh(server);
    assert.deepEqual(changed, [report.toString()], 'no change event when the text is the same');
    explanations.dispose();
  });

  it('keeps the report when the server has no answer, and stops following a closed report', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    const explanations = new Explanations();
    await explainActive(fakeServer({ 'llmmem.explain': onGpu('RTX-4090') }), explanations);
    const report = commands.executeCommand.calls[0]![1] as vscode.Uri;
    await explanations.refresh(fakeServer({ 'llmmem.explain': { error: 'not an open document' } }));
    await explanations.refresh(fakeServer());
    assert.match(explanations.provideTextDocumentContent(report), /on RTX-4090/);
    assert.deepEqual(explanations.explainedFiles(), ['file:///work/train.py']);
    explanations.forget(report);
    assert.deepEqual(explanations.explainedFiles(), []);
    explanations.dispose();
  });

  it('explains the last file while the Output panel has the focus', async () => {
    const file = fakeDocument('/work/train.py');
    workspace.textDocuments = [file];
    window.activeTextEditor = { document: file };
    const explanations = new Explanations();
    await explainActive(fakeServer({ 'llmmem.explain': onGpu('RTX-4090') }), explanations);
    window.activeTextEditor = { document: fakeDocument('extension-output-llmmem.llmmem-#1-llmmem', 'Log', 'output') };
    const server = fakeServer({ 'llmmem.explain': onGpu('RTX-4090') });
    await explainActive(server, explanations);
    assert.deepEqual(server.executeCommand.calls, [['llmmem.explain', ['file:///work/train.py']]]);
    explanations.dispose();
  });
});

describe('the status bar item', () => {
  it('shows the verdict for the active file and opens the GPU picker', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/train.py') };
    const server = fakeServer({
      'llmmem.explain': {
        uri: 'file:///work/train.py',
        budget: {
          device_total_bytes: 25.4 * 1024 ** 3,
          gpu: { name: 'RTX-4090', capacity_bytes: 24 * 1024 ** 3 },
          fits: false,
        },
      },
    });
    const bar = new StatusBar(server, log);
    await bar.refresh();
    const item = window.createStatusBarItem.results[0] as FakeStatusBarItem;
    assert.equal(item.text, '$(error) 25.4 GiB of 24.0 GiB on RTX-4090');
    assert.equal(item.command, 'llmmem.selectGpu');
    assert.deepEqual(item.backgroundColor, new vscode.ThemeColor('statusBarItem.errorBackground'));
    assert.equal(item.visible, true);
    assert.deepEqual(server.executeCommand.calls, [['llmmem.explain', ['file:///work/train.py']]]);
    bar.dispose();
  });

  it('hides for files llmmem does not read', async () => {
    window.activeTextEditor = { document: fakeDocument('/work/notes.md', 'markdown') };
    const server = fakeServer();
    const bar = new StatusBar(server, log);
    await bar.refresh();
    assert.equal((window.createStatusBarItem.results[0] as FakeStatusBarItem).visible, false);
    assert.equal(server.executeCommand.calls.length, 0);
    bar.dispose();
  });

  const overRtx = {
    'llmmem.explain': {
      uri: 'file:///work/train.py',
      budget: {
        device_total_bytes: 25.4 * 1024 ** 3,
        gpu: { name: 'RTX-4090', capacity_bytes: 24 * 1024 ** 3 },
        fits: false,
      },
    },
  };

  for (const [what, focused] of [
    ['the Output panel', { document: fakeDocument('extension-output-llmmem.llmmem-#1-llmmem', 'Log', 'output') }],
    ['a preview (no text editor)', undefined],
  ] as const) {
    it(`stays on the last file while ${what} has the focus`, async () => {
      const file = fakeDocument('/work/train.py');
      workspace.textDocuments = [file];
      window.activeTextEditor = { document: file };
      const server = fakeServer(overRtx);
      const bar = new StatusBar(server, log);
      await bar.refresh();
      window.activeTextEditor = focused;
      await bar.refresh();
      const item = window.createStatusBarItem.results[0] as FakeStatusBarItem;
      assert.equal(item.visible, true);
      assert.equal(item.text, '$(error) 25.4 GiB of 24.0 GiB on RTX-4090');
      assert.deepEqual(server.executeCommand.calls[1], ['llmmem.explain', ['file:///work/train.py']]);
      bar.dispose();
    });
  }

  it('hides once the last file is closed', async () => {
    const file = fakeDocument('/work/train.py');
    workspace.textDocuments = [file];
    window.activeTextEditor = { document: file };
    const bar = new StatusBar(fakeServer(overRtx), log);
    await bar.refresh();
    workspace.textDocuments = [];
    window.activeTextEditor = { document: fakeDocument('extension-output-llmmem.llmmem-#1-llmmem', 'Log', 'output') };
    await bar.refresh();
    assert.equal((window.createStatusBarItem.results[0] as FakeStatusBarItem).visible, false);
    bar.dispose();
  });
});
