/**
 * A small stand-in for the `vscode` module (VS Code provides the real one at run time): just
 * what the extension touches, with spies where tests look. test/setup.ts maps `vscode` here.
 */
import { resetSpies, spy } from './spy';

export enum ConfigurationTarget {
  Global = 1,
  Workspace = 2,
  WorkspaceFolder = 3,
}

export enum StatusBarAlignment {
  Left = 1,
  Right = 2,
}

export enum ViewColumn {
  Active = -1,
  Beside = -2,
}

export class ThemeColor {
  constructor(readonly id: string) {}
}

export class Uri {
  private constructor(
    readonly scheme: string,
    readonly path: string,
    readonly fragment = '',
  ) {}

  static file(path: string): Uri {
    return new Uri('file', path);
  }

  static parse(value: string): Uri {
    const match = /^([a-z][\w+.-]*):(?:\/\/[^/]*)?([^#]*)(?:#(.*))?$/i.exec(value);
    return match ? new Uri(match[1]!, decodeURIComponent(match[2] ?? ''), match[3] ?? '') : new Uri('file', value);
  }

  static from(parts: { scheme: string; path?: string; fragment?: string }): Uri {
    return new Uri(parts.scheme, parts.path ?? '', parts.fragment ?? '');
  }

  get fsPath(): string {
    return this.path;
  }

  toString(): string {
    const authority = this.scheme === 'file' ? '//' : '';
    return `${this.scheme}:${authority}${this.path}${this.fragment ? `#${this.fragment}` : ''}`;
  }
}

export class EventEmitter<T> {
  private listeners: ((value: T) => unknown)[] = [];
  readonly event = (listener: (value: T) => unknown) => {
    this.listeners.push(listener);
    return { dispose: () => (this.listeners = this.listeners.filter((l) => l !== listener)) };
  };
  fire(value: T): void {
    this.listeners.forEach((listener) => listener(value));
  }
  dispose(): void {
    this.listeners = [];
  }
}

/** Listeners registered through `onDid…` events, by event name, so tests can fire them. */
export const listeners = new Map<string, ((event: unknown) => unknown)[]>();

function eventNamed(name: string) {
  return spy((listener: (event: unknown) => unknown) => {
    listeners.set(name, [...(listeners.get(name) ?? []), listener]);
    return { dispose: () => undefined };
  });
}

/** Calls the listeners of `name` and waits for what they return. */
export async function fire(name: string, event: unknown): Promise<void> {
  await Promise.all((listeners.get(name) ?? []).map((listener) => listener(event)));
}

/** A configuration change event that affects `keys` (and their sections). */
export function configurationChange(...keys: string[]) {
  return {
    affectsConfiguration: (section: string) =>
      keys.some((key) => key === section || key.startsWith(`${section}.`)),
  };
}

/** Settings per target, as `workspace.getConfiguration(section)` reads and writes them. */
export const settingsStore = {
  defaults: new Map<string, unknown>(),
  global: new Map<string, unknown>(),
  workspace: new Map<string, unknown>(),
  reset(): void {
    this.defaults.clear();
    this.global.clear();
    this.workspace.clear();
  },
};

export interface FakeDocument {
  uri: Uri;
  languageId: string;
  isDirty: boolean;
  isUntitled: boolean;
  save: () => Promise<boolean>;
}

export function fakeDocument(path: string, languageId = 'python', scheme = 'file'): FakeDocument {
  return {
    uri: Uri.from({ scheme, path }),
    languageId,
    isDirty: false,
    isUntitled: scheme === 'untitled',
    save: spy(async () => true),
  };
}

export const configurationUpdates: { key: string; value: unknown; target: ConfigurationTarget }[] = [];

function configuration(section: string) {
  const key = (name: string) => `${section}.${name}`;
  return {
    get<T>(name: string, fallback?: T): T | undefined {
      const full = key(name);
      for (const layer of [settingsStore.workspace, settingsStore.global, settingsStore.defaults]) {
        if (layer.has(full)) {
          return layer.get(full) as T;
        }
      }
      return fallback;
    },
    inspect(name: string) {
      return {
        key: key(name),
        defaultValue: settingsStore.defaults.get(key(name)),
        globalValue: settingsStore.global.get(key(name)),
        workspaceValue: settingsStore.workspace.get(key(name)),
      };
    },
    async update(name: string, value: unknown, target: ConfigurationTarget): Promise<void> {
      configurationUpdates.push({ key: key(name), value, target });
      const layer = target === ConfigurationTarget.Global ? settingsStore.global : settingsStore.workspace;
      if (value === undefined) {
        layer.delete(key(name));
      } else {
        layer.set(key(name), value);
      }
    },
  };
}

export const workspace = {
  isTrusted: true,
  workspaceFolders: undefined as { uri: Uri; name: string; index: number }[] | undefined,
  textDocuments: [] as FakeDocument[],
  getConfiguration: spy((section: string) => configuration(section)),
  openTextDocument: spy(async (uri: Uri) => ({ uri, languageId: 'plaintext' })),
  registerTextDocumentContentProvider: spy((_scheme: string, _provider: unknown) => ({ dispose: () => undefined })),
  onDidChangeConfiguration: eventNamed('workspace.onDidChangeConfiguration'),
  onDidGrantWorkspaceTrust: eventNamed('workspace.onDidGrantWorkspaceTrust'),
  onDidChangeTextDocument: eventNamed('workspace.onDidChangeTextDocument'),
  onDidCloseTextDocument: eventNamed('workspace.onDidCloseTextDocument'),
};

export const env = { remoteName: undefined as string | undefined };

export const extensions = {
  getExtension: spy((_id: string): unknown => undefined),
};

export interface FakeStatusBarItem {
  text: string;
  tooltip: string;
  name: string | undefined;
  command: string | undefined;
  backgroundColor: ThemeColor | undefined;
  visible: boolean;
  show(): void;
  hide(): void;
  dispose(): void;
}

export interface FakeTerminal {
  lines: string[];
  shown: boolean;
  show(): void;
  sendText(line: string): void;
  dispose(): void;
}

type Message = (message: string, ...items: string[]) => Promise<string | undefined>;
const noAnswer: Message = async () => undefined;

export const ProgressLocation = { SourceControl: 1, Window: 10, Notification: 15 } as const;

export interface FakeWebviewPanel {
  viewType: string;
  title: string;
  webview: { html: string };
  revealed: number;
  disposed: boolean;
  reveal(): void;
  onDidDispose(listener: () => void): { dispose(): void };
  dispose(): void;
}

/** A cancellation token for `withProgress`; `cancelProgress()` cancels the running one. */
let progressCancelled: (() => void) | undefined;
export function cancelProgress(): void {
  progressCancelled?.();
}

export const window = {
  activeTextEditor: undefined as { document: FakeDocument } | undefined,
  activeNotebookEditor: undefined as { notebook: { uri: Uri; notebookType: string } } | undefined,
  showWarningMessage: spy(noAnswer),
  showInformationMessage: spy(noAnswer),
  showErrorMessage: spy(noAnswer),
  showQuickPick: spy(async (_items: unknown[], _options?: unknown): Promise<unknown> => undefined),
  showInputBox: spy(async (_options?: unknown): Promise<string | undefined> => undefined),
  showTextDocument: spy(async (_document: unknown, _options?: unknown) => undefined),
  createOutputChannel: spy((name: string) => ({
    name,
    lines: [] as string[],
    appendLine(line: string) {
      this.lines.push(line);
    },
    append(text: string) {
      this.lines.push(text);
    },
    show() {},
    dispose() {},
  })),
  createTerminal: spy(
    (_options?: unknown): FakeTerminal => ({
      lines: [],
      shown: false,
      show() {
        this.shown = true;
      },
      sendText(line: string) {
        this.lines.push(line);
      },
      dispose() {},
    }),
  ),
  createStatusBarItem: spy(
    (_id?: string, _alignment?: StatusBarAlignment, _priority?: number): FakeStatusBarItem => ({
      text: '',
      tooltip: '',
      name: undefined,
      command: undefined,
      backgroundColor: undefined,
      visible: false,
      show() {
        this.visible = true;
      },
      hide() {
        this.visible = false;
      },
      dispose() {},
    }),
  ),
  onDidChangeActiveTextEditor: eventNamed('window.onDidChangeActiveTextEditor'),
  onDidChangeActiveNotebookEditor: eventNamed('window.onDidChangeActiveNotebookEditor'),
  withProgress: spy(
    async <R>(
      _options: { location: number; title?: string; cancellable?: boolean },
      task: (
        progress: { report(value: { message?: string }): void },
        token: { isCancellationRequested: boolean; onCancellationRequested(listener: () => void): { dispose(): void } },
      ) => Promise<R>,
    ): Promise<R> => {
      const listeners: (() => void)[] = [];
      const token = {
        isCancellationRequested: false,
        onCancellationRequested(listener: () => void) {
          listeners.push(listener);
          return { dispose: () => undefined };
        },
      };
      progressCancelled = () => {
        token.isCancellationRequested = true;
        listeners.forEach((listener) => listener());
      };
      const reports: string[] = [];
      progressReports.push(reports);
      try {
        return await task({ report: (value) => void (value.message && reports.push(value.message)) }, token);
      } finally {
        progressCancelled = undefined;
      }
    },
  ),
  createWebviewPanel: spy(
    (viewType: string, title: string, _column: unknown, _options?: unknown): FakeWebviewPanel => {
      const disposeListeners: (() => void)[] = [];
      return {
        viewType,
        title,
        webview: { html: '' },
        revealed: 0,
        disposed: false,
        reveal() {
          this.revealed += 1;
        },
        onDidDispose(listener: () => void) {
          disposeListeners.push(listener);
          return { dispose: () => undefined };
        },
        dispose() {
          this.disposed = true;
          disposeListeners.forEach((listener) => listener());
        },
      };
    },
  ),
};

/** The messages each `withProgress` task reported, in order. */
export const progressReports: string[][] = [];

export const commands = {
  executeCommand: spy(async (_command: string, ..._args: unknown[]): Promise<unknown> => undefined),
  registerCommand: spy((_command: string, _callback: (...args: unknown[]) => unknown) => ({
    dispose: () => undefined,
  })),
};

export class CodeActionKind {
  static readonly QuickFix = new CodeActionKind('quickfix');
  constructor(readonly value: string) {}
}

export class CodeAction {
  diagnostics?: unknown[];
  command?: { title: string; command: string; arguments?: unknown[] };
  constructor(
    readonly title: string,
    readonly kind?: CodeActionKind,
  ) {}
}

export const languages = {
  registerCodeActionsProvider: spy((_selector: unknown, _provider: unknown, _metadata?: unknown) => ({
    dispose: () => undefined,
  })),
  setTextDocumentLanguage: spy(async (document: unknown, _language: string) => document),
  onDidChangeDiagnostics: eventNamed('languages.onDidChangeDiagnostics'),
};

/** Back to an empty, trusted workspace with no editors, and fresh spies. */
export function resetMock(): void {
  settingsStore.reset();
  configurationUpdates.length = 0;
  listeners.clear();
  workspace.isTrusted = true;
  workspace.workspaceFolders = undefined;
  workspace.textDocuments = [];
  window.activeTextEditor = undefined;
  window.activeNotebookEditor = undefined;
  env.remoteName = undefined;
  progressReports.length = 0;
  resetSpies();
}
