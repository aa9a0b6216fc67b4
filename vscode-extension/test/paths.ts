import * as path from 'node:path';

/** vscode-extension/ (this file runs from out/test/). */
export const EXTENSION_ROOT = path.resolve(__dirname, '..', '..');
/** The repository root. */
export const REPOSITORY_ROOT = path.resolve(EXTENSION_ROOT, '..');
