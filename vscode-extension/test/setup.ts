/**
 * Loaded by mocha before the tests: `vscode` (which only exists inside VS Code) and
 * vscode-languageclient (which needs it) resolve to small stand-ins under test/.
 */
import Module from 'node:module';
import * as path from 'node:path';

const standIns: Record<string, string> = {
  vscode: path.join(__dirname, 'vscode.mock.js'),
  'vscode-languageclient/node': path.join(__dirname, 'languageclient.fake.js'),
};

type Resolve = (request: string, ...rest: unknown[]) => string;
const moduleInternals = Module as unknown as { _resolveFilename: Resolve };
const resolve = moduleInternals._resolveFilename;
moduleInternals._resolveFilename = function (this: unknown, request: string, ...rest: unknown[]): string {
  return standIns[request] ?? resolve.call(this, request, ...rest);
};
