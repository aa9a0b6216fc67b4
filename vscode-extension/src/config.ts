/**
 * The extension's settings (`llmmem.*`) and the object the server reads from them.
 *
 * The server takes the same camelCase object as `initializationOptions` and as the answer to
 * `workspace/configuration` for section `llmmem`. Every key is always sent, with `null` for
 * "not set", so that clearing a setting also clears it on the server when it pulls again.
 */

export type SeverityLevel = 'error' | 'warning' | 'info' | 'off';

/** What the server reads (see `server/llmmem_lsp/settings.py`). */
export interface ServerSettings {
  gpu: string | null;
  worldSize: number | null;
  hub: boolean;
  hubTimeoutSeconds: number;
  severity: Record<string, SeverityLevel>;
  debounceMs: number;
  analysisTimeoutSeconds: number;
  detectGpu: boolean;
}

/** Reads one key of the `llmmem` configuration section (undefined when unset). */
export type SettingReader = (key: string) => unknown;

export const SETTINGS_SECTION = 'llmmem';

export const DEFAULT_SERVER_SETTINGS: Readonly<ServerSettings> = Object.freeze({
  gpu: null,
  worldSize: null,
  hub: true,
  hubTimeoutSeconds: 3,
  severity: {},
  debounceMs: 300,
  analysisTimeoutSeconds: 10,
  detectGpu: true,
});

function text(value: unknown): string | null {
  return typeof value === 'string' && value.trim() !== '' ? value.trim() : null;
}

function positiveInteger(value: unknown): number | null {
  return typeof value === 'number' && Number.isInteger(value) && value > 0 ? value : null;
}

function flag(value: unknown, fallback: boolean): boolean {
  return typeof value === 'boolean' ? value : fallback;
}

function number(value: unknown, fallback: number): number {
  return typeof value === 'number' && Number.isFinite(value) ? value : fallback;
}

function severities(value: unknown): Record<string, SeverityLevel> {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return {};
  }
  // passed on as written: the server reports a level it does not know, once, to the user
  return { ...(value as Record<string, SeverityLevel>) };
}

/** The server's settings from the user's `llmmem.*` settings. */
export function serverSettings(read: SettingReader): ServerSettings {
  return {
    gpu: text(read('gpu')),
    worldSize: positiveInteger(read('worldSize')),
    hub: flag(read('hub'), DEFAULT_SERVER_SETTINGS.hub),
    hubTimeoutSeconds: number(read('hubTimeoutSeconds'), DEFAULT_SERVER_SETTINGS.hubTimeoutSeconds),
    severity: severities(read('severity')),
    debounceMs: number(read('debounceMs'), DEFAULT_SERVER_SETTINGS.debounceMs),
    analysisTimeoutSeconds: number(
      read('analysisTimeoutSeconds'),
      DEFAULT_SERVER_SETTINGS.analysisTimeoutSeconds,
    ),
    detectGpu: flag(read('detectGpu'), DEFAULT_SERVER_SETTINGS.detectGpu),
  };
}

/** A `SettingReader` over a plain object, e.g. `{ gpu: 'RTX-4090' }`. */
export function readerOf(values: Record<string, unknown>): SettingReader {
  return (key) => values[key];
}
