/**
 * The llmmem extension: starts `<python> -m llmmem_lsp` with vscode-languageclient
 * (`serverController`), keeps its settings in step, and adds the status bar item, the commands
 * and the breakdown panel.
 */
import * as vscode from 'vscode';

import { BreakdownPanels } from './breakdownPanel';
import { EXTENSION_COMMANDS } from './client';
import { GPU_FIX_SELECTOR, gpuSettingFixProvider } from './gpuFixes';
import {
  Explanations,
  explainActive,
  refuseUntrusted,
  selectGpu,
  verifyActive,
  workingDocumentUri,
} from './commands';
import { SETTINGS_SECTION } from './config';
import { ServerController } from './serverController';
import { StatusBar } from './statusBar';

export { LlmmemClient, probe } from './serverController';

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
  const verify = async (target?: unknown) => {
    const outcome = await verifyActive(server, output, target);
    panels.scheduleRefresh(0); // measured beside predicted
    return outcome;
  };
  const server: ServerController = new ServerController(
    output,
    explanations,
    () => started.fire(),
    context.subscriptions,
    context.extensionPath,
    { refuseUntrusted, verify: (args) => verify(Array.isArray(args) ? args[0] : undefined) },
  );
  controller = server;
  const panels = new BreakdownPanels(server);
  const status = new StatusBar(server, output);
  context.subscriptions.push(
    server,
    status,
    started,
    panels,
    started.event(() => status.schedule(0)),
    vscode.commands.registerCommand(EXTENSION_COMMANDS.verify, (target?: unknown) => verify(target)),
    vscode.commands.registerCommand(EXTENSION_COMMANDS.showBreakdown, async (target?: unknown) => {
      const uri = typeof target === 'string' ? target : workingDocumentUri()?.toString();
      if (!uri) {
        await vscode.window.showInformationMessage('llmmem: open a training script or config to see its breakdown.');
        return undefined;
      }
      return panels.show(uri);
    }),
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
        panels.scheduleRefresh(1_000);
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
      const pictured = new Set(panels.files());
      if (event.uris.some((uri) => pictured.has(uri.toString()))) {
        panels.scheduleRefresh(300);
      }
    }),
    vscode.workspace.onDidChangeTextDocument((event) => {
      if (event.document === vscode.window.activeTextEditor?.document && event.contentChanges.length > 0) {
        status.schedule(1_000);
      }
      if (event.contentChanges.length > 0 && panels.files().includes(event.document.uri.toString())) {
        panels.scheduleRefresh(1_000);
      }
    }),
  );
  void server.start();
}

export async function deactivate(): Promise<void> {
  await controller?.stop();
  controller = undefined;
}
