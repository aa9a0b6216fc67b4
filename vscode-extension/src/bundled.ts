/**
 * The llmmem the extension carries (scripts/bundle-python.mjs puts it into bundled/, as
 * Microsoft's Python tool extensions carry theirs): `bundled/libs`, llmmem and the packages it
 * needs, put on the server's import path when the chosen interpreter has no llmmem; and
 * `bundled/wheel/llmmem-*.whl`, what "Install llmmem" installs into an interpreter the libs do
 * not fit (pip fetches its dependencies). The libs hold compiled packages for one Python version
 * and platform (`libs/llmmem-bundle.json`); another interpreter does not get them.
 */
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

export interface BundleStamp {
  cache_tag: string;
  platform: string;
  wheel: string;
}

export interface Bundle {
  libs?: string;
  stamp?: BundleStamp;
  wheel?: string;
}

/** What the extension folder carries (nothing, in a build without bundled/). */
export function findBundle(extensionPath: string): Bundle {
  const root = path.join(extensionPath, 'bundled');
  const bundle: Bundle = {};
  try {
    const libs = path.join(root, 'libs');
    const stamp = JSON.parse(fs.readFileSync(path.join(libs, 'llmmem-bundle.json'), 'utf8')) as BundleStamp;
    if (typeof stamp.cache_tag === 'string' && typeof stamp.platform === 'string') {
      bundle.libs = libs;
      bundle.stamp = stamp;
    }
  } catch {
    // no libs in this build
  }
  try {
    const wheels = fs.readdirSync(path.join(root, 'wheel')).filter((name) => /^llmmem-.*\.whl$/.test(name));
    if (wheels[0] !== undefined) {
      bundle.wheel = path.join(root, 'wheel', wheels[0]);
    }
  } catch {
    // no wheel in this build
  }
  return bundle;
}

/** The interpreter's `cache_tag` and platform, as the stamp writes them (undefined: no answer). */
export function interpreterTag(python: string, timeoutMs = 20_000): Promise<{ cache_tag: string; platform: string } | undefined> {
  const code = 'import json, sys, sysconfig; print(json.dumps({"cache_tag": sys.implementation.cache_tag, "platform": sysconfig.get_platform()}))';
  return new Promise((resolve) => {
    execFile(python, ['-c', code], { timeout: timeoutMs, windowsHide: true }, (error, stdout) => {
      if (error) {
        resolve(undefined);
        return;
      }
      try {
        resolve(JSON.parse(String(stdout)) as { cache_tag: string; platform: string });
      } catch {
        resolve(undefined);
      }
    });
  });
}

/** Why the libs do not fit `tag`, or undefined when they do. */
export function libsMismatch(stamp: BundleStamp, tag: { cache_tag: string; platform: string } | undefined): string | undefined {
  if (tag === undefined) {
    return 'the interpreter did not say its version';
  }
  if (tag.cache_tag !== stamp.cache_tag || tag.platform !== stamp.platform) {
    return `they are built for ${stamp.cache_tag} on ${stamp.platform}, the interpreter is ${tag.cache_tag} on ${tag.platform}`;
  }
  return undefined;
}

/** The environment with `libs` first on PYTHONPATH. */
export function withLibs(env: NodeJS.ProcessEnv, libs: string): NodeJS.ProcessEnv {
  const rest = env.PYTHONPATH ? `${path.delimiter}${env.PYTHONPATH}` : '';
  return { ...env, PYTHONPATH: `${libs}${rest}` };
}
