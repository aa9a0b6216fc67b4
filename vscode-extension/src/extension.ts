/**
 * The llmmem extension: starts `<python> -m llmmem_lsp` with vscode-languageclient, keeps its
 * settings in step, and adds the status bar item and the commands.
 */
import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  LanguageClient,
  type LanguageClientOptions,
  type ServerOptions,
  TransportKind,
} from 'vscode-languageclient/node';

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
  type ServerCheck,
} from './client';
import { GPU_FIX_SELECTOR, gpuSettingFixProvider } from './gpuFixes';
import {
  Explanations,
  explainActive,
  refuseUntrusted,
  selectGpu,
  verifyActive,
  type ServerRequests,
} from './commands';
import { SETTINGS_SECTION, serverSettings, type ServerSettings } from './config';
import {
  chooseInterpreter,
  settingOrigin,
  type InterpreterChoice,
  type PythonExtensionApi,
} from './interpreter';
import { StatusBar } from './statusBar';

const PYTHON_EXTENSION = 'ms-python.python';

/** How the extension asks an interpreter for llmmem (tests put a stand-in here). */
export const probe = { checkServerInstalled };
const INSTALL_POLL_MS = 3_000;
const INSTALL_POLL_LIMIT_MS = 15 * 60_000;

interface PythonApiWithEvents extends PythonExtensionApi {
  environments?: PythonExtensionApi['environments'] & {
    onDidChangeActiveEnvironmentPath?: vscode.Event<unknown>;
  };
}

/** The language client, with a normal end of the server process logged as such, not as an error. */
export class LlmmemClient extends LanguageClient {
  override error(message: string, data?: unknown, showNotification: boolean | 'force' = true): void {
    if (isNormalExit(message)) {
      this.info('Server process exited normally (code 0).', undefined, false);
      return;
    }
    super.error(message, data, showNotification);
  }
}

function currentSettings(): ServerSettings {
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

/** Starts, stops and restarts the language client; one at a time. */
class ServerController implements ServerRequests, vscode.Disposable {
  client: LanguageClient | undefined;
  interpreter: InterpreterChoice | undefined;
  private queue: Promise<unknown> = Promise.resolve();
  private installPoll: ReturnType<typeof setInterval> | undefined;
  private watchingPythonExtension = false;

  constructor(
    private readonly output: vscode.OutputChannel,
    private readonly explanations: Explanations,
    private readonly onStarted: () => void,
    private readonly subscriptions: vscode.Disposable[],
  ) {}

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
    const check = await probe.checkServerInstalled(choice.path);
    if (!check.ok) {
      this.log(`llmmem_lsp is not usable with ${choice.path}: ${check.detail}`);
      void this.offerInstall(choice, check);
      return;
    }
    this.log(`llmmem ${check.version}`);
    const executable = serverExecutable(choice.path, process.env, workspaceFolderPaths()[0]);
    const serverOptions: ServerOptions = { ...executable, transport: TransportKind.stdio };
    const clientOptions: LanguageClientOptions = {
      documentSelector: DOCUMENT_SELECTOR,
      outputChannel: this.output,
      // no diagnosticCollectionName: the server's pull diagnostics get a collection named by
      // its identifier ("llmmem"), and a second one of that name is refused with a warning
      initializationOptions: () => initializationOptions(currentSettings()),
      middleware: createMiddleware(currentSettings, {
        isTrusted: () => vscode.workspace.isTrusted,
        refuseUntrusted,
        showExplanation: (answer) => this.explanations.show(answer),
      }),
      markdown: { isTrusted: false, supportHtml: false },
    };
    const client = new LlmmemClient(CLIENT_ID, CLIENT_NAME, serverOptions, clientOptions);
    this.client = client;
    await client.start();
    this.onStarted();
  }

  private async stopNow(): Promise<void> {
    this.stopInstallPoll();
    const client = this.client;
    this.client = undefined;
    if (client) {
      try {
        await client.stop(5_000);
      } catch (error) {
        this.log(`stopping the server: ${String(error)}`);
      }
      await client.dispose();
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
    let answer: string | undefined;
    if (check.reason === 'not-installed') {
      answer = await vscode.window.showWarningMessage(
        `llmmem is not installed for ${choice.path}. Install it there with pip?`,
        install,
        chooseInterpreterAction,
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
    if (answer === install) {
      const terminal = vscode.window.createTerminal({ name: 'llmmem: install' });
      terminal.show();
      terminal.sendText(installCommandLine(choice.path));
      this.log(`installing: ${installCommandLine(choice.path)}`);
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

let controller: ServerController | undefined;

export function activate(context: vscode.ExtensionContext): void {
  const output = vscode.window.createOutputChannel('llmmem');
  const explanations = new Explanations();
  context.subscriptions.push(
    output,
    explanations,
    vscode.workspace.registerTextDocumentContentProvider(Explanations.scheme, explanations),
  );
  const started = new vscode.EventEmitter<void>();
  const server = new ServerController(output, explanations, () => started.fire(), context.subscriptions);
  controller = server;
  const status = new StatusBar(server, output);
  context.subscriptions.push(
    server,
    status,
    started,
    started.event(() => status.schedule(0)),
    vscode.commands.registerCommand(EXTENSION_COMMANDS.verify, () => verifyActive(server, output)),
    vscode.commands.registerCommand(EXTENSION_COMMANDS.explain, () => explainActive(server, explanations)),
    vscode.commands.registerCommand(EXTENSION_COMMANDS.selectGpu, (name?: unknown) => selectGpu(server, name)),
    vscode.languages.registerCodeActionsProvider(GPU_FIX_SELECTOR, gpuSettingFixProvider, {
      providedCodeActionKinds: [vscode.CodeActionKind.QuickFix],
    }),
    vscode.commands.registerCommand(EXTENSION_COMMANDS.restart, async () => {
      output.appendLine('restart requested');
      await server.restart();
    }),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (event.affectsConfiguration(`${SETTINGS_SECTION}.interpreter`)) {
        output.appendLine('llmmem.interpreter changed: restarting');
        void server.restart();
      } else if (event.affectsConfiguration(SETTINGS_SECTION)) {
        server.settingsChanged();
        status.schedule(1_000);
        explanations.scheduleRefresh(server, 1_000);
      }
    }),
    vscode.workspace.onDidCloseTextDocument((document) => explanations.forget(document.uri)),
    vscode.workspace.onDidGrantWorkspaceTrust(() => {
      output.appendLine('the workspace is trusted now: restarting (the interpreter may change)');
      void server.restart();
    }),
    vscode.window.onDidChangeActiveTextEditor(() => status.schedule(50)),
    vscode.window.onDidChangeActiveNotebookEditor(() => status.schedule(50)),
    vscode.languages.onDidChangeDiagnostics((event) => {
      status.diagnosticsChanged(event.uris);
      const explained = new Set(explanations.explainedFiles());
      if (event.uris.some((uri) => explained.has(uri.toString()))) {
        explanations.scheduleRefresh(server, 300);
      }
    }),
    vscode.workspace.onDidChangeTextDocument((event) => {
      if (event.document === vscode.window.activeTextEditor?.document && event.contentChanges.length > 0) {
        status.schedule(1_000);
      }
    }),
  );
  void server.start();
}

export async function deactivate(): Promise<void> {
  await controller?.stop();
  controller = undefined;
}
