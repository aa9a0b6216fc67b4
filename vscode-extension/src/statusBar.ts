/**
 * The status bar item: the active file's predicted peak against the GPU; a click picks the GPU.
 * It stays on the last file while the focus is on the Output panel or a preview.
 */
import * as vscode from 'vscode';

import { EXTENSION_COMMANDS, SERVER_COMMANDS } from './client';
import { workingDocumentUri, type Log, type ServerRequests } from './commands';
import { statusView, type ExplainAnswer } from './status';

export class StatusBar implements vscode.Disposable {
  private readonly item: vscode.StatusBarItem;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private sequence = 0;

  constructor(
    private readonly server: ServerRequests,
    private readonly log: Log,
  ) {
    this.item = vscode.window.createStatusBarItem('llmmem.status', vscode.StatusBarAlignment.Right, 100);
    this.item.name = 'llmmem';
    this.item.command = EXTENSION_COMMANDS.selectGpu;
  }

  /** Refresh after `delayMs` of quiet (calls in between push it back). */
  schedule(delayMs = 250): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.refresh();
    }, delayMs);
  }

  /** Refresh when diagnostics of the active file (or a cell of the active notebook) change. */
  diagnosticsChanged(uris: readonly vscode.Uri[]): void {
    const active = workingDocumentUri();
    if (!active) {
      return;
    }
    const notebook = vscode.window.activeNotebookEditor?.notebook;
    const related = (uri: vscode.Uri): boolean =>
      uri.toString() === active.toString() ||
      (notebook !== undefined &&
        notebook.uri.toString() === active.toString() &&
        uri.scheme === 'vscode-notebook-cell' &&
        uri.path === notebook.uri.path);
    if (uris.some(related)) {
      this.schedule();
    }
  }

  async refresh(): Promise<void> {
    const uri = workingDocumentUri();
    const sequence = ++this.sequence;
    if (!uri) {
      this.item.hide();
      return;
    }
    let answer: ExplainAnswer | undefined;
    try {
      answer = await this.server.executeCommand<ExplainAnswer>(SERVER_COMMANDS.explain, [uri.toString()]);
    } catch (error) {
      this.log.appendLine(`status: llmmem.explain failed: ${String(error)}`);
    }
    if (sequence !== this.sequence) {
      return; // a newer refresh is on its way
    }
    const view = statusView(answer);
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.backgroundColor =
      view.verdict === 'over' ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
    this.item.show();
  }

  dispose(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
    }
    this.item.dispose();
  }
}
