/**
 * The breakdown as a picture: a webview panel per file with the page the server makes
 * (`llmmem.breakdown`, the same page as `llmmem explain --format html`: the step's moments as
 * a stacked chart with the GPU's capacity and the band, the per-moment table, the formulas).
 * It follows the file: its diagnostics, the settings and a verify ask the server again.
 * The page is static (no script runs in the webview); its own Content-Security-Policy allows
 * inline styles only.
 */
import * as vscode from 'vscode';

import { SERVER_COMMANDS } from './client';
import type { ServerRequests } from './commands';

export interface BreakdownAnswer {
  uri?: string;
  version?: number | null;
  html?: string;
  stale?: boolean;
  error?: string;
  pending?: boolean;
}

const VIEW_TYPE = 'llmmem.breakdown';

function fileName(uri: string): string {
  const path = decodeURIComponent(uri.replace(/[?#].*$/, ''));
  return path.slice(path.lastIndexOf('/') + 1) || path;
}

function messagePage(title: string, text: string): string {
  const escaped = (value: string) =>
    value.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
  return (
    '<!DOCTYPE html><html><head><meta charset="utf-8">' +
    `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline';">` +
    `<title>${escaped(title)}</title></head><body><h1 style="font-size:16px">${escaped(title)}</h1>` +
    `<p>${escaped(text)}</p></body></html>`
  );
}

export class BreakdownPanels implements vscode.Disposable {
  /** source file URI → its panel */
  private readonly panels = new Map<string, vscode.WebviewPanel>();
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(private readonly server: ServerRequests) {}

  /** The files that have a panel (as URI strings). */
  files(): string[] {
    return [...this.panels.keys()];
  }

  /** Opens (or reveals) the panel of `uri` beside the editor and fills it. */
  async show(uri: string): Promise<vscode.WebviewPanel> {
    let panel = this.panels.get(uri);
    if (panel) {
      panel.reveal(vscode.ViewColumn.Beside, true);
    } else {
      panel = vscode.window.createWebviewPanel(
        VIEW_TYPE,
        `llmmem: ${fileName(uri)}`,
        { viewColumn: vscode.ViewColumn.Beside, preserveFocus: true },
        { enableScripts: false, retainContextWhenHidden: false, localResourceRoots: [] },
      );
      this.panels.set(uri, panel);
      const opened = panel;
      opened.onDidDispose(() => {
        if (this.panels.get(uri) === opened) {
          this.panels.delete(uri);
        }
      });
      panel.webview.html = messagePage(`llmmem: ${fileName(uri)}`, 'Asking the language server…');
    }
    await this.fill(uri, panel);
    return panel;
  }

  private async fill(uri: string, panel: vscode.WebviewPanel): Promise<void> {
    let answer: BreakdownAnswer | undefined;
    try {
      answer = await this.server.executeCommand<BreakdownAnswer>(SERVER_COMMANDS.breakdown, [uri]);
    } catch (error) {
      answer = { error: String(error) };
    }
    const title = `llmmem: ${fileName(uri)}`;
    if (answer === undefined) {
      panel.webview.html = messagePage(title, 'The llmmem language server is not running: see the llmmem output channel.');
    } else if (answer.html) {
      if (panel.webview.html !== answer.html) {
        panel.webview.html = answer.html;
      }
    } else if (!answer.pending) {
      panel.webview.html = messagePage(title, answer.error ?? 'No estimate for this file yet.');
    }
  }

  /** Asks the server again for every panel's file. */
  async refresh(): Promise<void> {
    for (const [uri, panel] of [...this.panels]) {
      await this.fill(uri, panel);
    }
  }

  /** `refresh` after `delayMs` of quiet (calls in between push it back). */
  scheduleRefresh(delayMs: number): void {
    if (this.panels.size === 0) {
      return;
    }
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.refresh();
    }, delayMs);
  }

  dispose(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
    }
    for (const panel of this.panels.values()) {
      panel.dispose();
    }
    this.panels.clear();
  }
}
