/**
 * Starts, stops and restarts the language client, one at a time: which Python runs the server,
 * with llmmem from that interpreter or from the libs the extension carries (`bundled`), and
 * what the user is told when it cannot start: one message with the cause and [Show Log].
 */
import * as vscode from 'vscode';
import {
  CloseAction,
  DidChangeConfigurationNotification,
  ErrorAction,
  type ErrorHandler,
  ExecuteCommandRequest,
  LanguageClient,
  type LanguageClientOptions,
  type ServerOptions,
  TransportKind,
  WorkDoneProgress,
} from 'vscode-languageclient/node';

import { findBundle, interpreterTag, libsMismatch, withLibs, type Bundle } from './bundled';
import {
  CLIENT_ID,
  CLIENT_NAME,
  DOCUMENT_SELECTOR,
  EXTENSION_COMMANDS,
  checkServerInstalled,
  createMiddleware,
  initializationOptions,
  installCommandLine,
  isNormalExit,
  serverExecutable,
  startOptions,
  type CommandGuards,
  type ServerCheck,
} from './client';
import type { Explanations, ServerRequests } from './commands';
import { SETTINGS_SECTION, serverSettings, type ServerSettings } from './config';
import { chooseInterpreter, settingOrigin, type InterpreterChoice, type PythonExtensionApi } from './interpreter';
import { StartWatch, teeChannel } from './startWatch';

const PYTHON_EXTENSION = 'ms-python.python';

/** How the extension asks an interpreter for llmmem (tests put stand-ins here). */
export const probe = { checkServerInstalled, interpreterTag };
const INSTALL_POLL_MS = 3_000;
const INSTALL_POLL_LIMIT_MS = 15 * 60_000;

interface PythonApiWithEvents extends PythonExtensionApi {
  environments?: PythonExtensionApi['environments'] & {
    onDidChangeActiveEnvironmentPath?: vscode.Event<unknown>;
  };
}

/** vscode-languageclient's own message when a start fails ("… couldn't create connection to
 * server."): the controller says it once, with the cause, instead. */
export function isStartFailure(message: string): boolean {
  return /client: couldn't create connection to server\.?$/.test(message.trim());
}

/** The language client, with a normal end of the server process logged as such, not as an
 * error, and a failed start logged without a second message. */
export class LlmmemClient extends LanguageClient {
  override error(message: string, data?: unknown, showNotification: boolean | 'force' = true): void {
    if (isNormalExit(message)) {
      this.info('Server process exited normally (code 0).', undefined, false);
      return;
    }
    super.error(message, data, isStartFailure(message) ? false : showNotification);
  }
}

export function currentSettings(): ServerSettings {
  const config = vscode.workspace.getConfiguration(SETTINGS_SECTION);
  return serverSettings((key) => config.get(key));
}

async function pythonExtensionApi(): Promise<PythonApiWithEvents | undefined> {
  const extension = vscode.extensions.getExtension<PythonApiWithEvents>(PYTHON_EXTENSION);
  if (!extension) {
    return undefined;
  }
  const api = extension.isActive ? extension.exports : await extension.activate();
  return api?.environments ? api : undefined;
}

function workspaceFolderPaths(): string[] {
  return (vscode.workspace.workspaceFolders ?? []).map((folder) => folder.uri.fsPath);
}

/** What the server runs with: llmmem from the interpreter, or from the bundled libs. */
interface Usable {
  check: Extract<ServerCheck, { ok: true }>;
  libs?: string;
}

export class ServerController implements ServerRequests, vscode.Disposable {
  client: LanguageClient | undefined;
  interpreter: InterpreterChoice | undefined;
  /** Why the last start failed (the status bar's tooltip says it), undefined once running. */
  startFailure: string | undefined;
  private queue: Promise<unknown> = Promise.resolve();
  private installPoll: ReturnType<typeof setInterval> | undefined;
  private watchingPythonExtension = false;
  private readonly bundle: Bundle;

  constructor(
    private readonly output: vscode.OutputChannel,
    private readonly explanations: Explanations,
    private readonly onStarted: () => void,
    private readonly subscriptions: vscode.Disposable[],
    extensionPath: string,
    private readonly guards: Pick<CommandGuards, 'refuseUntrusted' | 'verify'>,
  ) {
    this.bundle = findBundle(extensionPath);
  }

  private log(line: string): void {
    this.output.appendLine(line);
  }

  start(): Promise<unknown> {
    this.queue = this.queue.then(() => this.startNow()).catch((error) => this.failed(error));
    return this.queue;
  }

  restart(): Promise<unknown> {
    this.queue = this.queue
      .then(() => this.stopNow())
      .then(() => this.startNow())
      .catch((error) => this.failed(error));
    return this.queue;
  }

  stop(): Promise<unknown> {
    this.queue = this.queue.then(() => this.stopNow()).catch((error) => this.failed(error));
    return this.queue;
  }

  async executeCommand<T>(command: string, args: unknown[]): Promise<T | undefined> {
    const client = this.client;
    if (!client || !client.isRunning()) {
      return undefined;
    }
    return (await client.sendRequest(ExecuteCommandRequest.type, { command, arguments: args })) as T;
  }

  /** A command that reports progress on a token the client creates (`workDoneToken`), and
   * that `cancel` stops (`$/cancelRequest`: the server ends what it started). */
  async executeWithProgress<T>(
    command: string,
    args: unknown[],
    report: (message: string) => void,
    cancel: vscode.CancellationToken,
  ): Promise<T | undefined> {
    const client = this.client;
    if (!client || !client.isRunning()) {
      return undefined;
    }
    const token = `llmmem-${command}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
    const listening = client.onProgress(WorkDoneProgress.type, token, (value) => {
      if (value.kind !== 'end' && value.message) {
        report(value.message);
      }
    });
    try {
      return (await client.sendRequest(
        ExecuteCommandRequest.type,
        { command, arguments: args, workDoneToken: token },
        cancel,
      )) as T;
    } finally {
      listening.dispose();
    }
  }

  /** Settings other than the interpreter changed: the server pulls them again. */
  settingsChanged(): void {
    const client = this.client;
    if (client && client.isRunning()) {
      void client.sendNotification(DidChangeConfigurationNotification.type, {
        settings: { [SETTINGS_SECTION]: initializationOptions(currentSettings()) },
      });
    }
  }

  private failed(error: unknown): void {
    this.log(`error: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
    void vscode.window
      .showErrorMessage(`llmmem: the language server failed: ${String(error)}`, 'Show Log')
      .then((choice) => choice && this.output.show());
  }

  /** llmmem from the interpreter, else from the bundled libs where they fit it; undefined
   * (after saying why, and offering what can be done) where neither. */
  private async usable(choice: InterpreterChoice): Promise<Usable | undefined> {
    const check = await probe.checkServerInstalled(choice.path);
    if (check.ok) {
      return { check };
    }
    this.log(`llmmem_lsp is not usable with ${choice.path}: ${check.detail}`);
    if (check.reason === 'not-installed' && this.bundle.libs && this.bundle.stamp) {
      const mismatch = libsMismatch(this.bundle.stamp, await probe.interpreterTag(choice.path));
      if (mismatch === undefined) {
        const bundled = await probe.checkServerInstalled(choice.path, 30_000, withLibs(process.env, this.bundle.libs));
        if (bundled.ok) {
          this.log(`using the llmmem the extension carries (${this.bundle.libs})`);
          return { check: bundled, libs: this.bundle.libs };
        }
        this.log(`the bundled llmmem does not load with ${choice.path}: ${bundled.detail}`);
      } else {
        this.log(`the bundled llmmem does not fit ${choice.path}: ${mismatch}`);
      }
    }
    void this.offerInstall(choice, check);
    return undefined;
  }

  private async startNow(): Promise<void> {
    this.stopInstallPoll();
    const config = vscode.workspace.getConfiguration(SETTINGS_SECTION);
    const choice = await chooseInterpreter({
      setting: config.get<string>('interpreter'),
      pythonApi: async () => {
        const api = await pythonExtensionApi();
        this.watchPythonExtension(api);
        return api;
      },
      resource: vscode.workspace.workspaceFolders?.[0]?.uri,
      workspaceFolders: workspaceFolderPaths(),
      trusted: vscode.workspace.isTrusted,
    });
    this.interpreter = choice;
    for (const why of choice.passedOver) {
      this.log(`interpreter: passed over ${why}`);
    }
    const origin =
      choice.source === 'setting'
        ? `, llmmem.interpreter read from ${settingOrigin(config.inspect('interpreter'), vscode.env.remoteName)}`
        : '';
    this.log(`interpreter: ${choice.path} (from ${choice.source}${origin})`);
    const usable = await this.usable(choice);
    if (usable === undefined) {
      return;
    }
    this.log(`llmmem ${usable.check.version}`);
    const env = usable.libs ? withLibs(process.env, usable.libs) : process.env;
    const executable = serverExecutable(choice.path, env, workspaceFolderPaths()[0]);
    const serverOptions: ServerOptions = { ...executable, transport: TransportKind.stdio };
    const watch = new StartWatch();
    let running = false;
    let defaults: ErrorHandler | undefined; // one, so that it counts the restarts
    const defaultHandler = (): ErrorHandler => (defaults ??= client.createDefaultErrorHandler());
    const clientOptions: LanguageClientOptions = {
      documentSelector: DOCUMENT_SELECTOR,
      // the server's stderr is kept too: a server that stops at start says why in one message
      outputChannel: teeChannel(this.output, watch),
      // no diagnosticCollectionName: the server's pull diagnostics get a collection named by
      // its identifier ("llmmem"), and a second one of that name is refused with a warning
      initializationOptions: () => startOptions(currentSettings()),
      middleware: createMiddleware(currentSettings, {
        isTrusted: () => vscode.workspace.isTrusted,
        refuseUntrusted: this.guards.refuseUntrusted,
        showExplanation: (answer) => this.explanations.show(answer),
        ...(this.guards.verify ? { verify: this.guards.verify } : {}),
      }),
      // the step's hover links to the whole breakdown: that command, and no other, may run
      markdown: { isTrusted: { enabledCommands: [EXTENSION_COMMANDS.showBreakdown] }, supportHtml: false },
      // a server that ends before it ran: our one message, not the client's own
      initializationFailedHandler: () => false,
      errorHandler: {
        error: (error, message, count) =>
          running ? defaultHandler().error(error, message, count) : { action: ErrorAction.Shutdown, handled: true },
        closed: () => (running ? defaultHandler().closed() : { action: CloseAction.DoNotRestart, handled: true }),
      },
    };
    const client = new LlmmemClient(CLIENT_ID, CLIENT_NAME, serverOptions, clientOptions);
    this.client = client;
    try {
      await client.start();
    } catch (error) {
      await new Promise((resolve) => setTimeout(resolve, 300)); // its last stderr lines
      this.startFailed(watch.cause() ?? (error instanceof Error ? error.message : String(error)));
      return;
    }
    if (!client.isRunning()) {
      // vscode-languageclient's start() can resolve although the process ended before it
      // answered initialize (its state is then startFailed): the same failure, said the same way
      await new Promise((resolve) => setTimeout(resolve, 300));
      this.startFailed(watch.cause() ?? 'the server process ended as it started');
      return;
    }
    running = true;
    this.startFailure = undefined;
    this.onStarted();
  }

  /** One message: the server stopped at start, why, and [Show Log]. */
  private startFailed(cause: string): void {
    // the same cause as the start before (a restart that changed nothing): said once
    const repeated = this.startFailure === cause;
    this.startFailure = cause;
    this.log(`the server stopped at start: ${cause}`);
    this.onStarted(); // the status bar says it too
    if (repeated) {
      return;
    }
    void vscode.window
      .showErrorMessage(`llmmem: the language server stopped at start: ${cause}`, 'Show Log')
      .then((choice) => choice && this.output.show());
  }

  private async stopNow(): Promise<void> {
    this.stopInstallPoll();
    const client = this.client;
    this.client = undefined;
    if (client) {
      try {
        if (client.isRunning()) {
          await client.stop(5_000);
        }
      } catch (error) {
        this.log(`stopping the server: ${String(error)}`);
      }
      try {
        await client.dispose();
      } catch (error) {
        // a client whose server stopped at start cannot be stopped again: nothing to end
        this.log(`disposing the stopped client: ${String(error)}`);
      }
    }
  }

  private watchPythonExtension(api: PythonApiWithEvents | undefined): void {
    const event = api?.environments?.onDidChangeActiveEnvironmentPath;
    if (this.watchingPythonExtension || !event) {
      return;
    }
    this.watchingPythonExtension = true;
    this.subscriptions.push(
      event(() => {
        if (this.interpreter?.source !== 'setting') {
          this.log('the Python extension selected another interpreter: restarting');
          void this.restart();
        }
      }),
    );
  }

  private async offerInstall(choice: InterpreterChoice, check: Exclude<ServerCheck, { ok: true }>): Promise<void> {
    const chooseInterpreterAction = 'Choose Interpreter';
    const install = 'Install llmmem';
    const showLog = 'Show Log';
    const wheel = this.bundle.wheel;
    let answer: string | undefined;
    if (check.reason === 'not-installed') {
      answer = wheel
        ? await vscode.window.showWarningMessage(
            `llmmem is not installed for ${choice.path}. Install the llmmem this extension carries there with pip?`,
            install,
            chooseInterpreterAction,
          )
        : await vscode.window.showWarningMessage(
            `llmmem is not installed for ${choice.path}: choose an interpreter that has it.`,
            chooseInterpreterAction,
            showLog,
          );
    } else if (check.reason === 'no-python') {
      answer = await vscode.window.showErrorMessage(
        `llmmem: cannot run the Python interpreter ${choice.path}.`,
        chooseInterpreterAction,
        showLog,
      );
    } else {
      answer = await vscode.window.showErrorMessage(
        `llmmem: ${choice.path} cannot import llmmem_lsp: ${check.detail}`,
        chooseInterpreterAction,
        showLog,
      );
    }
    if (answer === install && wheel) {
      const line = installCommandLine(choice.path, wheel);
      const terminal = vscode.window.createTerminal({ name: 'llmmem: install' });
      terminal.show();
      terminal.sendText(line);
      this.log(`installing: ${line}`);
      this.pollForInstall(choice.path);
    } else if (answer === chooseInterpreterAction) {
      if (choice.source !== 'setting' && vscode.extensions.getExtension(PYTHON_EXTENSION)) {
        await vscode.commands.executeCommand('python.setInterpreter');
      } else {
        await vscode.commands.executeCommand('workbench.action.openSettings', 'llmmem.interpreter');
      }
    } else if (answer === showLog) {
      this.output.show();
    }
  }

  /** Start the server once pip has put llmmem in place. */
  private pollForInstall(python: string): void {
    this.stopInstallPoll();
    const started = Date.now();
    let checking = false;
    this.installPoll = setInterval(() => {
      if (checking) {
        return;
      }
      if (Date.now() - started > INSTALL_POLL_LIMIT_MS) {
        this.stopInstallPoll();
        return;
      }
      checking = true;
      void probe.checkServerInstalled(python).then((check) => {
        checking = false;
        if (check.ok && this.installPoll !== undefined) {
          this.log(`llmmem ${check.version} is installed: starting the server`);
          this.stopInstallPoll();
          void this.start();
        }
      });
    }, INSTALL_POLL_MS);
  }

  private stopInstallPoll(): void {
    if (this.installPoll !== undefined) {
      clearInterval(this.installPoll);
      this.installPoll = undefined;
    }
  }

  dispose(): void {
    this.stopInstallPoll();
  }
}
