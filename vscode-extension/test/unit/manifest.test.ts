import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';
import * as path from 'node:path';

import { EXTENSION_COMMANDS, SERVER_COMMANDS } from '../../src/client';
import { DEFAULT_SERVER_SETTINGS } from '../../src/config';
import { EXTENSION_ROOT } from '../paths';

interface Manifest {
  activationEvents: string[];
  capabilities: { untrustedWorkspaces: { supported: string; restrictedConfigurations: string[] } };
  contributes: {
    commands: { command: string }[];
    configuration: { properties: Record<string, { default?: unknown }> };
  };
}

const manifest = JSON.parse(fs.readFileSync(path.join(EXTENSION_ROOT, 'package.json'), 'utf-8')) as Manifest;
const properties = manifest.contributes.configuration.properties;

describe('package.json', () => {
  it('contributes the extension commands, none named like a server command', () => {
    const contributed = manifest.contributes.commands.map((c) => c.command);
    assert.deepEqual([...contributed].sort(), Object.values(EXTENSION_COMMANDS).sort());
    for (const name of Object.values(SERVER_COMMANDS)) {
      assert.ok(!contributed.includes(name), name);
    }
  });

  it("declares each server setting with the server's default", () => {
    const defaults: Record<string, unknown> = { ...DEFAULT_SERVER_SETTINGS, gpu: '' };
    for (const [key, value] of Object.entries(defaults)) {
      const property = properties[`llmmem.${key}`];
      assert.ok(property, key);
      assert.deepEqual(property.default, value, key);
    }
    assert.equal(properties['llmmem.interpreter']?.default, '');
  });

  it('is limited in untrusted workspaces and keeps the interpreter setting out of them', () => {
    const untrusted = manifest.capabilities.untrustedWorkspaces;
    assert.equal(untrusted.supported, 'limited');
    assert.ok(untrusted.restrictedConfigurations.includes('llmmem.interpreter'));
  });

  it('activates on Python, YAML, shell scripts, notebooks and DeepSpeed JSON configs, not on any JSON', () => {
    for (const event of ['onLanguage:python', 'onLanguage:yaml', 'onLanguage:shellscript', 'onNotebook:jupyter-notebook']) {
      assert.ok(manifest.activationEvents.includes(event), event);
    }
    assert.ok(!manifest.activationEvents.includes('onLanguage:json'));
    assert.ok(!manifest.activationEvents.includes('*'));
    const json = manifest.activationEvents.filter((event) => event.startsWith('workspaceContains:'));
    assert.ok(json.some((event) => event.includes('deepspeed') && event.endsWith('.json')), JSON.stringify(json));
  });

  it('reads llmmem.interpreter in window scope: User, Remote and Workspace settings all count', () => {
    const interpreter = properties['llmmem.interpreter'] as { scope?: string };
    assert.equal(interpreter.scope, 'window');
  });
});
