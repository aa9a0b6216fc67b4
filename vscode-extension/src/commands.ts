/**
 * The extension's commands: Verify on GPU, Explain, Select GPU; and the GPU picker the status
 * bar item opens. They talk to the server through `ServerRequests` so they can be tested
 * without a running server.
 */
import * as vscode from 'vscode';

import { LANGUAGES, SERVER_COMMANDS, VERIFY_ACTION } from './client';
import { SETTINGS_SECTION } from './config';
import { explanationMarkdown, explanationTitle } from './report';
import type { ExplainAnswer } from './status';

/** The running server, seen from the commands. */
export interface ServerRequests {
  /** Runs a server command (`workspace/executeCommand`); undefined when no server runs. */
  executeCommand<T>(command: string, args: unknown[]): Promise<T | undefined>;
  /** The same, reporting on a progress the client creates; `cancel` stops it. */
  executeWithProgress?<T>(
    command: string,
    args: unknown[],
    report: (message: string) => void,
    cancel: vscode.CancellationToken,
  ): Promise<T | undefined>;
}

/** `llmmem.verify`'s answer. */
export interface VerifyOutcome {
  ok: boolean;
  message: string;
  cancelled?: boolean;
  /** Where no CUDA device was found: whether a simulated step can run this plan, and why not. */
  simulate?: { possible: boolean; why?: string };
}

export interface Log {
  appendLine(line: string): void;
}

export interface GpuEntry {
  name: string;
  memoryGiB: number;
  bf16: boolean;
}

const SUPPORTED = new Set<string>(LANGUAGES);

/** The URI the server knows the active file by: the notebook's for a notebook cell. */
export function activeDocumentUri(): vscode.Uri | undefined {
  const editor = vscode.window.activeTextEditor;
  const notebook = vscode.window.activeNotebookEditor;
  if (editor && editor.document.uri.scheme === 'vscode-notebook-cell') {
    return notebook?.notebook.uri;
  }
  if (editor) {
    return SUPPORTED.has(editor.document.languageId) ? editor.document.uri : undefined;
  }
  if (notebook && notebook.notebook.notebookType === 'jupyter-notebook') {
    return notebook.notebook.uri;
  }
  return undefined;
}

/** Schemes of what a user edits (a file, an unsaved buffer, a notebook cell); the Output
 * panel (`output`), a report (`llmmem-report`), a diff's other side and the like are not. */
const EDITED_SCHEMES = new Set(['file', 'untitled', 'vscode-notebook-cell']);

let lastWorkedOn: vscode.Uri | undefined;

function stillOpen(uri: vscode.Uri): boolean {
  const key = uri.toString();
  const notebooks = (vscode.workspace as { notebookDocuments?: readonly { uri: vscode.Uri }[] }).notebookDocuments ?? [];
  return (
    vscode.workspace.textDocuments.some((document) => document.uri.toString() === key) ||
    notebooks.some((notebook) => notebook.uri.toString() === key)
  );
}

/**
 * The file the user is working on: the active editor's when it shows a file, else — while the
 * focus is on the Output panel, a preview or another webview — the last file that was active,
 * as long as it is still open.
 */
export function workingDocumentUri(): vscode.Uri | undefined {
  const editor = vscode.window.activeTextEditor;
  const editsAFile = editor !== undefined && EDITED_SCHEMES.has(editor.document.uri.scheme);
  if (editsAFile || (editor === undefined && vscode.window.activeNotebookEditor !== undefined)) {
    lastWorkedOn = activeDocumentUri();
    return lastWorkedOn;
  }
  if (lastWorkedOn !== undefined && !stillOpen(lastWorkedOn)) {
    lastWorkedOn = undefined;
  }
  return lastWorkedOn;
}

/** Forgets the last file (tests). */
export function forgetWorkingDocument(): void {
  lastWorkedOn = undefined;
}

export async function refuseUntrusted(action: string): Promise<void> {
  const manage = 'Manage Workspace Trust';
  const choice = await vscode.window.showWarningMessage(
    `llmmem: ${action} is turned off in an untrusted workspace: it runs the training script's ` +
      'model for a step. Trust this workspace to use it.',
    manage,
  );
  if (choice === manage) {
    await vscode.commands.executeCommand('workbench.trust.manage');
  }
}

function isCancellation(error: unknown): boolean {
  const code = (error as { code?: unknown } | undefined)?.code;
  return code === -32800 || (error instanceof Error && /cancel/i.test(error.message));
}

/** One run of `llmmem.verify` in a notification with Cancel (undefined: no server). */
async function verifyRun(
  server: ServerRequests,
  uri: vscode.Uri,
  options: Record<string, unknown> | undefined,
  log: Log,
): Promise<VerifyOutcome | undefined> {
  const name = uri.path.slice(uri.path.lastIndexOf('/') + 1) || uri.toString();
  const args: unknown[] = options ? [uri.toString(), options] : [uri.toString()];
  const title = options?.simulate ? `llmmem: simulating a step of ${name}` : `llmmem: verifying ${name} on the GPU`;
  return vscode.window.withProgress(
    { location: vscode.ProgressLocation.Notification, title, cancellable: true },
    async (progress, cancel) => {
      try {
        const outcome = server.executeWithProgress
          ? await server.executeWithProgress<VerifyOutcome>(
              SERVER_COMMANDS.verify,
              args,
              (message) => progress.report({ message }),
              cancel,
            )
          : await server.executeCommand<VerifyOutcome>(SERVER_COMMANDS.verify, args);
        // the server may end a cancelled run with its own answer rather than an error
        if (outcome?.cancelled) {
          log.appendLine('verify cancelled');
        }
        return outcome;
      } catch (error) {
        if (cancel.isCancellationRequested || isCancellation(error)) {
          log.appendLine('verify cancelled');
          return { ok: false, cancelled: true, message: 'verify cancelled' };
        }
        throw error;
      }
    },
  );
}

/** `llmmem: Verify on GPU` (and the code lens's Verify): one real step of the file, in a
 * notification with Cancel; where there is no CUDA device, a simulated step is offered only
 * where one can run this plan. */
export async function verifyActive(server: ServerRequests, log: Log, target?: unknown): Promise<unknown> {
  if (!vscode.workspace.isTrusted) {
    log.appendLine('verify refused: the workspace is not trusted');
    await refuseUntrusted(VERIFY_ACTION);
    return undefined;
  }
  const uri = typeof target === 'string' ? vscode.Uri.parse(target) : workingDocumentUri();
  if (!uri) {
    await vscode.window.showInformationMessage('llmmem: open a training script or config to verify.');
    return undefined;
  }
  const document = vscode.workspace.textDocuments.find((d) => d.uri.toString() === uri.toString());
  if (document?.isUntitled) {
    await vscode.window.showInformationMessage('llmmem: save the file first: Verify runs it from disk.');
    return undefined;
  }
  if (document?.isDirty) {
    const save = 'Save and Verify';
    const choice = await vscode.window.showInformationMessage(
      'llmmem: Verify runs the file as saved on disk.',
      save,
    );
    if (choice !== save || !(await document.save())) {
      return undefined;
    }
  }
  log.appendLine(`verify ${uri.toString()}`);
  const outcome = await verifyRun(server, uri, undefined, log);
  if (outcome === undefined) {
    await vscode.window.showWarningMessage('llmmem: the language server is not running.');
    return outcome;
  }
  log.appendLine(`verify: ${outcome.message}`);
  if (outcome.cancelled) {
    return outcome;
  }
  if (outcome.ok) {
    void vscode.window.showInformationMessage(`llmmem: ${outcome.message}`);
    return outcome;
  }
  const simulate = outcome.simulate;
  if (simulate?.possible) {
    // no CUDA device where the server runs: the same step can be simulated without one
    const instead = 'Simulate instead';
    const choice = await vscode.window.showInformationMessage(
      'llmmem: no GPU here to verify on. Simulate the step instead (no GPU, no weights)?',
      instead,
    );
    if (choice === instead) {
      const simulated = await verifyRun(server, uri, { simulate: true }, log);
      if (simulated !== undefined) {
        log.appendLine(`verify (simulated): ${simulated.message}`);
        if (!simulated.cancelled) {
          const show = simulated.ok ? vscode.window.showInformationMessage : vscode.window.showWarningMessage;
          void show(`llmmem: ${simulated.message}`);
        }
      }
      return simulated;
    }
    return outcome;
  }
  if (simulate && !simulate.possible) {
    await vscode.window.showWarningMessage(
      `llmmem: no GPU here to verify on, and a simulated step cannot run this plan: ${simulate.why ?? 'see the log'}.`,
    );
    return outcome;
  }
  await vscode.window.showWarningMessage(`llmmem: ${outcome.message}`);
  return outcome;
}

/** Shows reports in a Markdown preview, from a read-only virtual document, and keeps them up
 * to date: `refresh` asks the server again for the file each report is about. */
export class Explanations implements vscode.TextDocumentContentProvider {
  static readonly scheme = 'llmmem-report';
  private readonly documents = new Map<string, string>();
  /** report URI → the URI of the file it explains */
  private readonly sources = new Map<string, string>();
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.changed.event;
  private timer: ReturnType<typeof setTimeout> | undefined;

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.documents.get(uri.toString()) ?? '';
  }

  /** The files whose reports are shown (as URI strings). */
  explainedFiles(): string[] {
    return [...new Set(this.sources.values())];
  }

  private reportUri(answer: ExplainAnswer): vscode.Uri {
    return vscode.Uri.from({
      scheme: Explanations.scheme,
      path: `/${explanationTitle(answer).replace(/[\\/:]/g, ' ').trim()}.md`,
    });
  }

  /** Puts the answer in its report; the report's URI when its text changed. */
  private store(answer: ExplainAnswer): vscode.Uri | undefined {
    const uri = this.reportUri(answer);
    const key = uri.toString();
    if (answer.uri) {
      this.sources.set(key, answer.uri);
    }
    const markdown = explanationMarkdown(answer);
    if (this.documents.get(key) === markdown) {
      return undefined;
    }
    this.documents.set(key, markdown);
    this.changed.fire(uri);
    return uri;
  }

  async show(answer: ExplainAnswer): Promise<vscode.Uri> {
    const uri = this.reportUri(answer);
    this.store(answer);
    try {
      await vscode.commands.executeCommand('markdown.showPreviewToSide', uri);
    } catch {
      const document = await vscode.workspace.openTextDocument(uri);
      await vscode.languages.setTextDocumentLanguage(document, 'markdown');
      await vscode.window.showTextDocument(document, { preview: true, viewColumn: vscode.ViewColumn.Beside });
    }
    return uri;
  }

  /** Asks the server again for every report's file (settings changed, or its diagnostics). */
  async refresh(server: ServerRequests): Promise<void> {
    for (const source of this.explainedFiles()) {
      let answer: ExplainAnswer | undefined;
      try {
        answer = await server.executeCommand<ExplainAnswer>(SERVER_COMMANDS.explain, [source]);
      } catch {
        continue; // the report keeps what it says until the server answers
      }
      if (answer && answer.error === undefined) {
        this.store({ ...answer, uri: answer.uri ?? source });
      }
    }
  }

  /** `refresh` after `delayMs` of quiet (calls in between push it back). */
  scheduleRefresh(server: ServerRequests, delayMs: number): void {
    if (this.sources.size === 0) {
      return;
    }
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.refresh(server);
    }, delayMs);
  }

  /** A report's document was closed: stop following its file. */
  forget(uri: vscode.Uri): void {
    if (uri.scheme === Explanations.scheme) {
      this.sources.delete(uri.toString());
      this.documents.delete(uri.toString());
    }
  }

  dispose(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
    }
    this.changed.dispose();
  }
}

/** `llmmem: Explain`: the breakdown of the active file as a Markdown report. */
export async function explainActive(server: ServerRequests, explanations: Explanations): Promise<unknown> {
  const uri = workingDocumentUri();
  if (!uri) {
    await vscode.window.showInformationMessage('llmmem: open a training script or config to explain.');
    return undefined;
  }
  const answer = await server.executeCommand<ExplainAnswer>(SERVER_COMMANDS.explain, [uri.toString()]);
  if (answer === undefined) {
    await vscode.window.showWarningMessage('llmmem: the language server is not running.');
    return undefined;
  }
  await explanations.show({ ...answer, uri: answer.uri ?? uri.toString() });
  return answer;
}

/** Where to write `llmmem.gpu`: where it is set now, else the workspace when one is open. */
export function gpuSettingTarget(
  inspected: { workspaceValue?: unknown; globalValue?: unknown } | undefined,
  hasWorkspace: boolean,
): vscode.ConfigurationTarget {
  if (inspected?.workspaceValue !== undefined) {
    return vscode.ConfigurationTarget.Workspace;
  }
  if (inspected?.globalValue !== undefined || !hasWorkspace) {
    return vscode.ConfigurationTarget.Global;
  }
  return vscode.ConfigurationTarget.Workspace;
}

interface GpuItem extends vscode.QuickPickItem {
  gpu: string | null;
}

const DETECT_LABEL = '$(search) No GPU setting';

/** `llmmem: Select GPU` (and a click on the status bar item): pick from the catalog, write
 * `llmmem.gpu`. Returns the name written, null when cleared, undefined when cancelled. */
export async function selectGpu(server: ServerRequests, name?: unknown): Promise<string | null | undefined> {
  const config = vscode.workspace.getConfiguration(SETTINGS_SECTION);
  const current = config.get<string>('gpu') || '';
  let chosen: string | null | undefined;
  // a name given (a quick fix's close match) is written without asking
  const catalog =
    typeof name === 'string' ? [] : ((await server.executeCommand<GpuEntry[]>(SERVER_COMMANDS.gpus, [])) ?? []);
  if (typeof name === 'string') {
    chosen = name;
  } else if (catalog.length === 0) {
    const typed = await vscode.window.showInputBox({
      title: 'llmmem: GPU',
      prompt: 'A GPU name (A100-80GB, H100, RTX-4090, ...) or a capacity (24GiB); empty to clear',
      value: current,
    });
    chosen = typed === undefined ? undefined : typed.trim() || null;
  } else {
    const items: GpuItem[] = [
      {
        label: DETECT_LABEL,
        description: current ? `clear "${current}"` : '',
        detail: 'A file\'s "# llmmem: gpu=" pragma, pyproject.toml [tool.llmmem], or this machine\'s GPU',
        gpu: null,
      },
      ...catalog.map((entry) => ({
        label: entry.name,
        description:
          `${entry.memoryGiB} GiB${entry.bf16 ? '' : ' · no bf16'}` +
          (entry.name === current ? ' · current' : ''),
        gpu: entry.name,
      })),
    ];
    const picked = await vscode.window.showQuickPick(items, {
      title: 'llmmem: GPU to estimate against',
      placeHolder: current ? `now: ${current}` : 'type to filter: A100, H100, 4090, L40S, ...',
      matchOnDescription: true,
      // a Markdown preview beside the file takes the focus when it renders again, and that
      // would close the picker under the user's typing
      ignoreFocusOut: true,
    });
    chosen = picked === undefined ? undefined : picked.gpu;
  }
  if (chosen === undefined) {
    return undefined;
  }
  const target = gpuSettingTarget(
    config.inspect('gpu'),
    (vscode.workspace.workspaceFolders?.length ?? 0) > 0,
  );
  await config.update('gpu', chosen ?? undefined, target);
  return chosen;
}
