import { strict as assert } from 'node:assert';
import type { CancellationToken, ConfigurationParams } from 'vscode-languageserver-protocol';

import {
  DOCUMENT_SELECTOR,
  SERVER_COMMANDS,
  createMiddleware,
  installCommandLine,
  serverExecutable,
} from '../../src/client';
import { readerOf, serverSettings } from '../../src/config';
import type { ExplainAnswer } from '../../src/status';
import { spy } from '../spy';

const token = {} as CancellationToken;

function guards(trusted: boolean) {
  return {
    isTrusted: () => trusted,
    refuseUntrusted: spy((_action: string) => undefined),
    showExplanation: spy((_answer: ExplainAnswer) => undefined),
  };
}

describe('the server process', () => {
  it('is `<python> -m llmmem_lsp` with the given environment', () => {
    assert.deepEqual(serverExecutable('/envs/ml/bin/python', { PATH: '/bin', HF_HUB_OFFLINE: '1' }, '/work'), {
      command: '/envs/ml/bin/python',
      args: ['-m', 'llmmem_lsp'],
      options: { env: { PATH: '/bin', HF_HUB_OFFLINE: '1' }, cwd: '/work' },
    });
  });

  it('gets Python, YAML, JSON and shell files, the Python cells of notebooks and pyproject.toml', () => {
    const languages = new Set(DOCUMENT_SELECTOR.flatMap((filter) => ('language' in filter ? [filter.language] : [])));
    assert.deepEqual([...languages].sort(), ['json', 'python', 'shellscript', 'yaml']);
    assert.deepEqual(
      DOCUMENT_SELECTOR.filter((filter) => 'pattern' in filter),
      [{ scheme: 'file', pattern: '**/pyproject.toml' }],
    );
    assert.deepEqual(
      DOCUMENT_SELECTOR.filter((filter) => 'notebook' in filter),
      [{ notebook: 'jupyter-notebook', language: 'python' }],
    );
    assert.ok(DOCUMENT_SELECTOR.some((f) => 'scheme' in f && f.scheme === 'file' && 'language' in f && f.language === 'yaml'));
  });

  it('installs the wheel the extension carries (no package name an index may lack), spaces and all', () => {
    const wheel = '/ext/bundled/wheel/llmmem-0.1.0-py3-none-any.whl';
    assert.equal(installCommandLine('/envs/ml/bin/python', wheel, 'linux'), `/envs/ml/bin/python -m pip install ${wheel}`);
    assert.equal(
      installCommandLine("/My Envs/it's/python", '/My Ext/llmmem-0.1.0-py3-none-any.whl', 'darwin'),
      `'/My Envs/it'"'"'s/python' -m pip install '/My Ext/llmmem-0.1.0-py3-none-any.whl'`,
    );
    assert.equal(
      installCommandLine('C:\\Program Files\\Python312\\python.exe', 'C:\\My Ext\\llmmem.whl', 'win32'),
      '& "C:\\Program Files\\Python312\\python.exe" -m pip install "C:\\My Ext\\llmmem.whl"',
    );
    assert.doesNotMatch(installCommandLine('python3', wheel, 'linux'), /pip install llmmem$/);
  });
});

describe('the middleware', () => {
  it('answers workspace/configuration for llmmem with the server settings', async () => {
    const middleware = createMiddleware(() => serverSettings(readerOf({ gpu: 'RTX-4090', worldSize: 2 })));
    const next = spy((_params: ConfigurationParams, _token: CancellationToken) => [] as unknown[]);
    const params: ConfigurationParams = { items: [{ section: 'llmmem', scopeUri: 'file:///work/a.py' }] };
    const answer = await middleware.workspace.configuration(params, token, next);
    assert.equal(next.calls.length, 0);
    assert.deepEqual(answer, [
      { gpu: 'RTX-4090', worldSize: 2, hub: true, hubTimeoutSeconds: 3, severity: {}, debounceMs: 300, analysisTimeoutSeconds: 10, detectGpu: true },
    ]);
  });

  it("leaves other sections to VS Code's own answer", async () => {
    const middleware = createMiddleware(() => serverSettings(readerOf({})));
    const next = spy(async (_params: ConfigurationParams, _token: CancellationToken) => [{ indent: 4 }, { ignored: true }]);
    const answer = (await middleware.workspace.configuration(
      { items: [{ section: 'python' }, { section: 'llmmem' }] },
      token,
      next,
    )) as Record<string, unknown>[];
    assert.equal(next.calls.length, 1);
    assert.deepEqual(answer[0], { indent: 4 });
    assert.equal(answer[1]!.gpu, null);
    assert.equal(answer[1]!.hub, true);
  });

  it('refuses llmmem.verify in an untrusted workspace without asking the server', async () => {
    const untrusted = guards(false);
    const middleware = createMiddleware(() => serverSettings(readerOf({})), untrusted);
    const next = spy(async (_command: string, _args: unknown[]): Promise<unknown> => ({ ok: true }));
    assert.equal(await middleware.executeCommand(SERVER_COMMANDS.verify, ['file:///a.py'], next), undefined);
    assert.equal(next.calls.length, 0);
    assert.deepEqual(untrusted.refuseUntrusted.calls, [['Verify']]);
  });

  it('runs llmmem.verify when trusted, and shows the report the code lens asks for', async () => {
    const trusted = guards(true);
    const middleware = createMiddleware(() => serverSettings(readerOf({})), trusted);
    const next = spy(async (command: string, _args: unknown[]): Promise<unknown> =>
      command === 'llmmem.explain' ? { markdown: '# x' } : { ok: true },
    );
    assert.deepEqual(await middleware.executeCommand(SERVER_COMMANDS.verify, ['file:///a.py'], next), { ok: true });
    await middleware.executeCommand(SERVER_COMMANDS.explain, ['file:///a.py'], next);
    assert.deepEqual(trusted.showExplanation.calls, [[{ markdown: '# x' }]]);
    assert.equal(trusted.refuseUntrusted.calls.length, 0);
  });

  it("hands the code lens's Verify to the extension's (notification progress with Cancel)", async () => {
    const verify = spy(async (_args: unknown[]): Promise<unknown> => ({ ok: true, message: 'measured' }));
    const middleware = createMiddleware(() => serverSettings(readerOf({})), { ...guards(true), verify });
    const next = spy(async (_command: string, _args: unknown[]): Promise<unknown> => ({ ok: false }));
    assert.deepEqual(await middleware.executeCommand(SERVER_COMMANDS.verify, ['file:///a.py'], next), {
      ok: true,
      message: 'measured',
    });
    assert.deepEqual(verify.calls, [[['file:///a.py']]]);
    assert.equal(next.calls.length, 0);
  });
});
