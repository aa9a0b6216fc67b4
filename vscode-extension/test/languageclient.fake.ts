/**
 * A stand-in for `vscode-languageclient/node`: a LanguageClient that records how it was built
 * and what was sent to it, and the few protocol values the extension names.
 */
import { spy } from './spy';

export const TransportKind = { stdio: 0, ipc: 1, pipe: 2, socket: 3 } as const;
export const ExecuteCommandRequest = { type: { method: 'workspace/executeCommand' } };
export const DidChangeConfigurationNotification = { type: { method: 'workspace/didChangeConfiguration' } };

export interface BuiltClient {
  id: string;
  name: string;
  serverOptions: { command: string; args: string[]; options: { env: NodeJS.ProcessEnv; cwd?: string } };
  clientOptions: {
    documentSelector: unknown[];
    initializationOptions: () => unknown;
    middleware: { workspace: { configuration: unknown }; executeCommand: unknown };
  };
}

/** Every client built since the last `clients.length = 0`. */
export const clients: LanguageClient[] = [];

export class LanguageClient implements BuiltClient {
  running = false;
  readonly start = spy(async () => {
    this.running = true;
  });
  readonly stop = spy(async (_timeout?: number) => {
    this.running = false;
  });
  readonly dispose = spy(async () => undefined);
  readonly sendNotification = spy(async (_type: unknown, _params: unknown) => undefined);
  readonly sendRequest = spy(async (_type: unknown, _params: unknown): Promise<unknown> => undefined);
  /** What the client logged, as vscode-languageclient's `info`/`error` would. */
  readonly logged: { level: 'info' | 'error'; message: string }[] = [];

  info(message: string, _data?: unknown, _showNotification?: boolean): void {
    this.logged.push({ level: 'info', message });
  }

  error(message: string, _data?: unknown, _showNotification?: boolean | 'force'): void {
    this.logged.push({ level: 'error', message });
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
