/**
 * Which Python runs the server: the `llmmem.interpreter` setting, else the interpreter selected
 * in the Python extension, else `python3` (`python` on Windows) from PATH.
 */
import * as os from 'node:os';
import * as path from 'node:path';

export type InterpreterSource = 'setting' | 'python-extension' | 'default';

export interface Interpreter {
  path: string;
  source: InterpreterSource;
}

/** The slice of the Python extension's API (`ms-python.python` exports) used here. */
export interface PythonExtensionApi {
  environments?: {
    getActiveEnvironmentPath(resource?: unknown): { id: string; path: string } | undefined;
    resolveEnvironment(
      environment: { id: string; path: string } | string,
    ): Promise<{ executable?: { uri?: { fsPath: string } } } | undefined>;
  };
}

export interface InterpreterSources {
  /** The `llmmem.interpreter` setting as written. */
  setting: string | undefined;
  /** The Python extension's API, or undefined when it is not installed or has none. */
  pythonApi: () => Promise<PythonExtensionApi | undefined>;
  /** The resource whose interpreter is wanted (the first workspace folder). */
  resource?: unknown;
  workspaceFolders: string[];
  trusted: boolean;
  platform?: NodeJS.Platform;
  home?: string;
}

export function defaultInterpreter(platform: NodeJS.Platform = process.platform): string {
  return platform === 'win32' ? 'python' : 'python3';
}

/** `~/…`, `${workspaceFolder}/…` and paths relative to the first workspace folder. */
export function expandInterpreterSetting(
  value: string,
  workspaceFolders: string[],
  home: string = os.homedir(),
): string {
  let expanded = value.trim();
  const folder = workspaceFolders[0];
  if (folder !== undefined) {
    expanded = expanded.replace(/\$\{workspaceFolder\}/g, folder);
  }
  if (expanded === '~' || expanded.startsWith('~/') || expanded.startsWith('~\\')) {
    expanded = path.join(home, expanded.slice(1));
  }
  const looksLikePath = expanded.includes('/') || expanded.includes('\\');
  if (looksLikePath && !path.isAbsolute(expanded) && folder !== undefined) {
    expanded = path.resolve(folder, expanded);
  }
  return expanded;
}

/** True when `file` lies inside one of `folders`. */
export function insideAny(file: string, folders: string[]): boolean {
  return folders.some((folder) => {
    const relative = path.relative(folder, file);
    return relative !== '' && !relative.startsWith('..') && !path.isAbsolute(relative);
  });
}

/** The interpreter the Python extension has selected for `resource`, as an executable path. */
export async function pythonExtensionInterpreter(
  api: PythonExtensionApi,
  resource?: unknown,
): Promise<string | undefined> {
  const environments = api.environments;
  if (!environments) {
    return undefined;
  }
  const active = environments.getActiveEnvironmentPath(resource);
  if (!active) {
    return undefined;
  }
  const resolved = await environments.resolveEnvironment(active);
  return resolved?.executable?.uri?.fsPath ?? (active.path || undefined);
}

export interface InterpreterChoice extends Interpreter {
  /** Why a candidate before this one was passed over (for the output channel). */
  passedOver: string[];
}

export async function chooseInterpreter(sources: InterpreterSources): Promise<InterpreterChoice> {
  const passedOver: string[] = [];
  if (sources.setting !== undefined && sources.setting.trim() !== '') {
    return {
      path: expandInterpreterSetting(sources.setting, sources.workspaceFolders, sources.home),
      source: 'setting',
      passedOver,
    };
  }
  try {
    const api = await sources.pythonApi();
    const found = api ? await pythonExtensionInterpreter(api, sources.resource) : undefined;
    if (found !== undefined) {
      if (!sources.trusted && insideAny(found, sources.workspaceFolders)) {
        // an interpreter inside an untrusted folder is code from that folder: don't run it
        passedOver.push(`${found} (inside the untrusted workspace)`);
      } else {
        return { path: found, source: 'python-extension', passedOver };
      }
    }
  } catch (error) {
    passedOver.push(`the Python extension's interpreter (${String(error)})`);
  }
  return { path: defaultInterpreter(sources.platform), source: 'default', passedOver };
}

/** The layers of a setting, as `WorkspaceConfiguration.inspect` gives them. */
export interface InspectedSetting {
  globalValue?: unknown;
  workspaceValue?: unknown;
  workspaceFolderValue?: unknown;
}

function isSet(value: unknown): boolean {
  return typeof value === 'string' ? value.trim() !== '' : value !== undefined && value !== null;
}

/**
 * Which settings file the value in effect was read from, for the output channel. In a remote
 * window (`remoteName` set) the user layer is the local User settings merged with the Remote
 * (machine) settings, and VS Code does not tell them apart.
 */
export function settingOrigin(inspected: InspectedSetting | undefined, remoteName?: string): string {
  if (isSet(inspected?.workspaceFolderValue)) {
    return 'Workspace Folder settings';
  }
  if (isSet(inspected?.workspaceValue)) {
    return 'Workspace settings';
  }
  if (isSet(inspected?.globalValue)) {
    return remoteName ? `User or Remote [${remoteName}] settings` : 'User settings';
  }
  return 'no settings file';
}
