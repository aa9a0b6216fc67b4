/**
 * The language client's pieces that do not need VS Code: how the server is started, which
 * documents it gets, the initialization options, and the middleware that answers
 * `workspace/configuration` and guards the server's commands. `extension.ts` hands these to
 * vscode-languageclient; the protocol test hands them to a plain JSON-RPC connection.
 */
import { execFile } from 'node:child_process';
import type {
  CancellationToken,
  ConfigurationParams,
  ConfigurationRequest,
  ResponseError,
} from 'vscode-languageserver-protocol';

import { SETTINGS_SECTION, type ServerSettings } from './config';
import type { ExplainAnswer } from './status';

export const CLIENT_ID = 'llmmem';
export const CLIENT_NAME = 'llmmem';
export const SERVER_MODULE = 'llmmem_lsp';

/** Commands the server registers (vscode-languageclient turns them into VS Code commands). */
export const SERVER_COMMANDS = {
  explain: 'llmmem.explain',
  verify: 'llmmem.verify',
  gpus: 'llmmem.gpus',
  breakdown: 'llmmem.breakdown',
} as const;

/** The extension's own commands (distinct names: the server's are registered already). */
export const EXTENSION_COMMANDS = {
  verify: 'llmmem.verifyActive',
  explain: 'llmmem.explainActive',
  selectGpu: 'llmmem.selectGpu',
  restart: 'llmmem.restart',
  showBreakdown: 'llmmem.showBreakdown',
} as const;

export const LANGUAGES = ['python', 'yaml', 'json', 'shellscript'] as const;

export type DocumentFilter =
  | { scheme: string; language: string }
  | { scheme: string; pattern: string }
  | { notebook: string; language: string };

/** Files on disk and unsaved buffers in the four languages, Python cells of notebooks, and
 * pyproject.toml (GPU names completed in its [tool.llmmem] table). */
export const DOCUMENT_SELECTOR: DocumentFilter[] = [
  ...LANGUAGES.flatMap((language) => [
    { scheme: 'file', language },
    { scheme: 'untitled', language },
  ]),
  { notebook: 'jupyter-notebook', language: 'python' },
  { scheme: 'file', pattern: '**/pyproject.toml' },
];

/** An `Executable` for vscode-languageclient (stdio is its default transport). */
export interface ServerExecutable {
  command: string;
  args: string[];
  options: { env: NodeJS.ProcessEnv; cwd?: string };
}

export function serverExecutable(
  python: string,
  env: NodeJS.ProcessEnv = process.env,
  cwd?: string,
): ServerExecutable {
  return {
    command: python,
    args: ['-m', SERVER_MODULE],
    options: cwd === undefined ? { env: { ...env } } : { env: { ...env }, cwd },
  };
}

/** vscode-languageclient logs every end of the server process as an error, a normal stop too
 * ("Server process exited with code 0."): true for that message, which is not one. */
export function isNormalExit(message: string): boolean {
  return /^Server process exited with code 0\.?$/.test(message.trim());
}

/** `initializationOptions`: the server settings object itself. */
export function initializationOptions(settings: ServerSettings): ServerSettings {
  return { ...settings, severity: { ...settings.severity } };
}

/** What `initialize` carries besides the settings: the command the step's hover links to
 * (the whole breakdown in a panel). */
export function startOptions(settings: ServerSettings): ServerSettings & { breakdownCommand: string } {
  return { ...initializationOptions(settings), breakdownCommand: EXTENSION_COMMANDS.showBreakdown };
}

/** The answers to a `workspace/configuration` request: the server settings for `llmmem`,
 * whatever `others` gives for any other section. */
export function configurationAnswers(
  params: ConfigurationParams,
  settings: ServerSettings,
  others: readonly unknown[] | undefined,
): unknown[] {
  return params.items.map((item, index) =>
    item.section === SETTINGS_SECTION ? initializationOptions(settings) : (others?.[index] ?? null),
  );
}

export interface CommandGuards {
  isTrusted(): boolean;
  /** Tell the user why `action` does not run here. */
  refuseUntrusted(action: string): unknown;
  /** Show the report the server answered to `llmmem.explain` (the code lens runs it). */
  showExplanation(answer: ExplainAnswer): unknown;
  /** Run Verify as the command does (notification progress with Cancel) for the code lens's
   * `llmmem.verify`; absent, the server's command runs as it is. */
  verify?(args: unknown[]): Promise<unknown>;
}

type ConfigurationNext = ConfigurationRequest.HandlerSignature;
type CommandNext = (command: string, args: unknown[]) => unknown;

export const VERIFY_ACTION = 'Verify';

/**
 * The client middleware: answers `workspace/configuration` for `llmmem` from the current
 * settings (VS Code's own answer for other sections), refuses `llmmem.verify` in an untrusted
 * workspace, and shows the report when the code lens runs `llmmem.explain`.
 */
export function createMiddleware(currentSettings: () => ServerSettings, guards?: CommandGuards) {
  return {
    workspace: {
      configuration: async (
        params: ConfigurationParams,
        token: CancellationToken,
        next: ConfigurationNext,
      ): Promise<unknown[] | ResponseError<void>> => {
        const settings = currentSettings();
        const ours = params.items.every((item) => item.section === SETTINGS_SECTION);
        if (ours) {
          return configurationAnswers(params, settings, undefined);
        }
        const others: unknown = await next(params, token);
        if (!Array.isArray(others)) {
          return others as ResponseError<void>; // an error: pass it on
        }
        return configurationAnswers(params, settings, others);
      },
    },
    executeCommand: async (command: string, args: unknown[], next: CommandNext) => {
      if (command === SERVER_COMMANDS.verify && guards && !guards.isTrusted()) {
        await guards.refuseUntrusted(VERIFY_ACTION);
        return undefined;
      }
      if (command === SERVER_COMMANDS.verify && guards?.verify) {
        return guards.verify(args);
      }
      const answer = await next(command, args);
      if (command === SERVER_COMMANDS.explain && guards && answer && typeof answer === 'object') {
        await guards.showExplanation(answer);
      }
      return answer;
    },
  };
}

export type ServerCheck =
  | { ok: true; version: string }
  | { ok: false; reason: 'no-python' | 'not-installed' | 'failed'; detail: string };

/** Does `python -c "import llmmem_lsp"` work (with `env`: the bundled libs on its path)? */
export function checkServerInstalled(
  python: string,
  timeoutMs = 30_000,
  env?: NodeJS.ProcessEnv,
): Promise<ServerCheck> {
  const probe = `import ${SERVER_MODULE}, llmmem; print(llmmem.__version__)`;
  return new Promise((resolve) => {
    const options = { timeout: timeoutMs, windowsHide: true, ...(env ? { env } : {}) };
    execFile(python, ['-c', probe], options, (error, stdout, stderr) => {
      if (!error) {
        resolve({ ok: true, version: String(stdout).trim() });
        return;
      }
      const code = (error as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' || code === 'EACCES') {
        resolve({ ok: false, reason: 'no-python', detail: `cannot run ${python}: ${error.message}` });
        return;
      }
      const lines = String(stderr).trim().split(/\r?\n/);
      const last = lines[lines.length - 1] || error.message;
      const missing = /ModuleNotFoundError|No module named/.test(String(stderr));
      resolve({ ok: false, reason: missing ? 'not-installed' : 'failed', detail: last });
    });
  });
}

function quotePosix(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'"'"'`)}'`;
}

/** The terminal line that installs the wheel the extension carries into `python` (pip fetches
 * its dependencies): never a package name that no index may have. */
export function installCommandLine(
  python: string,
  wheel: string,
  platform: NodeJS.Platform = process.platform,
): string {
  if (platform === 'win32') {
    // PowerShell (the default Windows terminal) needs the call operator for a quoted path
    const quote = (word: string) => (/\s/.test(word) ? `"${word}"` : word);
    const call = /\s/.test(python) ? `& "${python}"` : python;
    return `${call} -m pip install ${quote(wheel)}`;
  }
  return `${quotePosix(python)} -m pip install ${quotePosix(wheel)}`;
}
