/**
 * A stand-in for `vscode-languageclient/node`: a LanguageClient that records how it was built
 * and what was sent to it, and the few protocol values the extension names.
 */
import { spy } from './spy';

export const TransportKind = { stdio: 0, ipc: 1, pipe: 2, socket: 3 } as const;
export const ExecuteCommandRequest = { type: { method: 'workspace/executeCommand' } };
export const DidChangeConfigurationNotification = { type: { method: 'workspace/didChangeConfiguration' } };
export const WorkDoneProgress = { type: { method: '$/progress' } };
export const CloseAction = { DoNotRestart: 1, Restart: 2 } as const;
export const ErrorAction = { Continue: 1, Shutdown: 2 } as const;
export type ErrorHandler = {
  error(error: unknown, message: unknown, count: number | undefined): unknown;
  closed(): unknown;
};

export interface BuiltClient {
  id: string;
  name: string;
  serverOptions: { command: string; args: string[]; options: { env: NodeJS.ProcessEnv; cwd?: string } };
  clientOptions: {
    documentSelector: unknown[];
    initializationOptions: () => unknown;
    middleware: { workspace: { configuration: unknown }; executeCommand: unknown };
    outputChannel?: { append(text: string): void; appendLine(text: string): void };
    markdown?: unknown;
    errorHandler?: ErrorHandler;
  };
}

/** Every client built since the last `clients.length = 0`. */
export const clients: LanguageClient[] = [];

/** How the next clients' `start` behaves (a test sets it; undefined: it starts). A `with` that
 * resolves to 'ended' makes `start` resolve with the client not running, as the real client's
 * start can when the process ends before it answers initialize. */
export const starting: { with: ((client: LanguageClient) => Promise<void | 'ended'>) | undefined } = {
  with: undefined,
};

export class LanguageClient implements BuiltClient {
  running = false;
  readonly start = spy(async () => {
    const outcome = starting.with ? await starting.with(this) : undefined;
    this.running = outcome !== 'ended';
  });
  readonly stop = spy(async (_timeout?: number) => {
    this.running = false;
  });
  readonly dispose = spy(async () => undefined);
  readonly sendNotification = spy(async (_type: unknown, _params: unknown) => undefined);
  readonly sendRequest = spy(async (_type: unknown, _params: unknown, _token?: unknown): Promise<unknown> => undefined);
  /** Progress handlers by token, as `onProgress` registered them. */
  readonly progress = new Map<string | number, (value: unknown) => void>();
  onProgress(_type: unknown, token: string | number, handler: (value: unknown) => void): { dispose(): void } {
    this.progress.set(token, handler);
    return { dispose: () => this.progress.delete(token) };
  }
  createDefaultErrorHandler(): ErrorHandler {
    return { error: () => ({ action: ErrorAction.Shutdown }), closed: () => ({ action: CloseAction.Restart }) };
  }
  /** What the client logged, as vscode-languageclient's `info`/`error` would. */
  readonly logged: { level: 'info' | 'error'; message: string; notify: boolean | 'force' }[] = [];

  info(message: string, _data?: unknown, showNotification: boolean = true): void {
    this.logged.push({ level: 'info', message, notify: showNotification });
  }

  error(message: string, _data?: unknown, showNotification: boolean | 'force' = true): void {
    this.logged.push({ level: 'error', message, notify: showNotification });
  }

  constructor(
    readonly id: string,
    readonly name: string,
    readonly serverOptions: BuiltClient['serverOptions'],
    readonly clientOptions: BuiltClient['clientOptions'],
  ) {
    clients.push(this);
  }

  isRunning(): boolean {
    return this.running;
  }
}
