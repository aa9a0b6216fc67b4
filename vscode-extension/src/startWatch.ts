/**
 * Why a server that stopped at start stopped: the last lines it wrote to stderr, which
 * vscode-languageclient copies to the output channel with `append` (its own log lines come
 * with `appendLine`). The channel handed to the client is a tee that keeps them, so that one message can say the cause (and [Show Log] the rest).
 */
import type * as vscode from 'vscode';

const KEPT_LINES = 20;

export class StartWatch {
  private readonly lines: string[] = [];
  private partial = '';

  /** Text the server wrote (any chunking). */
  record(text: string): void {
    const parts = (this.partial + text).split(/\r?\n/);
    this.partial = parts.pop() ?? '';
    for (const line of parts) {
      if (line.trim() !== '') {
        this.lines.push(line.trimEnd());
      }
    }
    this.lines.splice(0, Math.max(0, this.lines.length - KEPT_LINES));
  }

  /** The line that says why: the last exception or error line the server wrote, else its
   * last line; undefined when it wrote nothing. */
  cause(): string | undefined {
    const lines = this.partial.trim() ? [...this.lines, this.partial.trim()] : this.lines;
    const telling = [...lines]
      .reverse()
      .find((line) => /^\S*(Error|Exception)\b|^\S+: error: |\berror\b/i.test(line.trim()) && !/^\s*File "/.test(line));
    return (telling ?? lines[lines.length - 1])?.trim();
  }
}

/** An output channel that writes to `channel` and lets `watch` read what is appended. */
export function teeChannel(channel: vscode.OutputChannel, watch: StartWatch): vscode.OutputChannel {
  return {
    get name() {
      return channel.name;
    },
    append(value: string) {
      watch.record(value);
      channel.append(value);
    },
    appendLine(value: string) {
      // the client's own log lines ("[Error - ...] Server process exited"): not the server's
      channel.appendLine(value);
    },
    replace(value: string) {
      channel.replace(value);
    },
    clear() {
      channel.clear();
    },
    show(preserveFocus?: boolean) {
      channel.show(preserveFocus);
    },
    hide() {
      channel.hide();
    },
    dispose() {
      // the extension's channel outlives each client
    },
  } as vscode.OutputChannel;
}
