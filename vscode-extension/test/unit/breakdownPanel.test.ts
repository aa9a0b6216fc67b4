import { strict as assert } from 'node:assert';

import { BreakdownPanels } from '../../src/breakdownPanel';
import { spy } from '../spy';
import { resetMock, window, type FakeWebviewPanel } from '../vscode.mock';

beforeEach(() => resetMock());

function serverWith(page: () => unknown) {
  const executeCommand = spy(async (_command: string, _args: unknown[]) => page());
  return { executeCommand: executeCommand as typeof executeCommand & (<T>(c: string, a: unknown[]) => Promise<T | undefined>) };
}

describe('the breakdown panel', () => {
  it("shows the server's page for the file, with scripts off, and follows it", async () => {
    let total = '29.8 GiB';
    const server = serverWith(() => ({ version: 1, html: `<html><body><svg></svg>${total}</body></html>` }));
    const panels = new BreakdownPanels(server);
    await panels.show('file:///work/train.py');
    assert.deepEqual(server.executeCommand.calls, [['llmmem.breakdown', ['file:///work/train.py']]]);
    const [viewType, title, , options] = window.createWebviewPanel.calls[0]!;
    assert.equal(viewType, 'llmmem.breakdown');
    assert.equal(title, 'llmmem: train.py');
    assert.equal((options as { enableScripts: boolean }).enableScripts, false);
    const panel = window.createWebviewPanel.results[0] as FakeWebviewPanel;
    assert.match(panel.webview.html, /29\.8 GiB/);
    total = '19.7 GiB';
    await panels.refresh();
    assert.match(panel.webview.html, /19\.7 GiB/);
    // shown again: the same panel, revealed
    await panels.show('file:///work/train.py');
    assert.equal(window.createWebviewPanel.calls.length, 1);
    assert.equal(panel.revealed, 1);
    assert.deepEqual(panels.files(), ['file:///work/train.py']);
    panel.dispose();
    assert.deepEqual(panels.files(), []);
  });

  it('says why there is no page (no server, no estimate)', async () => {
    const panels = new BreakdownPanels(serverWith(() => undefined));
    await panels.show('file:///work/train.py');
    const panel = window.createWebviewPanel.results[0] as FakeWebviewPanel;
    assert.match(panel.webview.html, /language server is not running/);
    const other = new BreakdownPanels(serverWith(() => ({ error: 'not an open document: file:///x.py' })));
    await other.show('file:///x.py');
    assert.match((window.createWebviewPanel.results[1] as FakeWebviewPanel).webview.html, /not an open document/);
  });
});
