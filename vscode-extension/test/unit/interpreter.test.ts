import { strict as assert } from 'node:assert';
import * as path from 'node:path';

import {
  chooseInterpreter,
  defaultInterpreter,
  expandInterpreterSetting,
  type PythonExtensionApi,
} from '../../src/interpreter';
import { spy } from '../spy';

const WORKSPACE = path.resolve('/work/project');

function pythonApi(executable: string | undefined, activePath = '/envs/ml'): PythonExtensionApi {
  return {
    environments: {
      getActiveEnvironmentPath: () => ({ id: 'ml', path: activePath }),
      resolveEnvironment: async () =>
        executable === undefined ? undefined : { executable: { uri: { fsPath: executable } } },
    },
  };
}

const base = {
  setting: undefined as string | undefined,
  workspaceFolders: [WORKSPACE],
  trusted: true,
  platform: 'linux' as NodeJS.Platform,
  home: '/home/me',
};

describe('the interpreter that runs the server', () => {
  it('is llmmem.interpreter first, without asking the Python extension', async () => {
    const api = spy(async () => pythonApi('/envs/ml/bin/python'));
    const choice = await chooseInterpreter({ ...base, setting: '/opt/llmmem/bin/python', pythonApi: api });
    assert.equal(choice.path, '/opt/llmmem/bin/python');
    assert.equal(choice.source, 'setting');
    assert.equal(api.calls.length, 0);
  });

  it("is the Python extension's selected environment when the setting is empty", async () => {
    const choice = await chooseInterpreter({
      ...base,
      setting: '  ',
      pythonApi: async () => pythonApi('/envs/ml/bin/python'),
    });
    assert.equal(choice.path, '/envs/ml/bin/python');
    assert.equal(choice.source, 'python-extension');
  });

  it("uses the environment's path when the Python extension cannot resolve it", async () => {
    const choice = await chooseInterpreter({
      ...base,
      pythonApi: async () => pythonApi(undefined, '/usr/bin/python3.11'),
    });
    assert.equal(choice.path, '/usr/bin/python3.11');
    assert.equal(choice.source, 'python-extension');
  });

  it('is python3 from PATH without the Python extension (python on Windows)', async () => {
    const linux = await chooseInterpreter({ ...base, pythonApi: async () => undefined });
    assert.equal(linux.path, 'python3');
    assert.equal(linux.source, 'default');
    const windows = await chooseInterpreter({ ...base, platform: 'win32', pythonApi: async () => ({}) });
    assert.equal(windows.path, 'python');
    assert.equal(windows.source, 'default');
    assert.equal(defaultInterpreter('darwin'), 'python3');
  });

  it('falls back to python3 when the Python extension throws', async () => {
    const choice = await chooseInterpreter({
      ...base,
      pythonApi: async () => {
        throw new Error('not activated');
      },
    });
    assert.equal(choice.source, 'default');
    assert.match(choice.passedOver.join(), /not activated/);
  });

  it('does not run an interpreter from inside an untrusted workspace', async () => {
    const inside = path.join(WORKSPACE, '.venv', 'bin', 'python');
    const untrusted = await chooseInterpreter({ ...base, trusted: false, pythonApi: async () => pythonApi(inside) });
    assert.equal(untrusted.path, 'python3');
    assert.equal(untrusted.source, 'default');
    assert.match(untrusted.passedOver.join(), /untrusted/);
    const trusted = await chooseInterpreter({ ...base, pythonApi: async () => pythonApi(inside) });
    assert.equal(trusted.path, inside);
    const outside = await chooseInterpreter({
      ...base,
      trusted: false,
      pythonApi: async () => pythonApi('/envs/ml/bin/python'),
    });
    assert.equal(outside.source, 'python-extension');
  });

  it('expands ~, ${workspaceFolder} and relative paths in the setting', () => {
    assert.equal(
      expandInterpreterSetting('${workspaceFolder}/.venv/bin/python', [WORKSPACE]),
      `${WORKSPACE}/.venv/bin/python`,
    );
    assert.equal(
      expandInterpreterSetting('~/envs/ml/bin/python', [], '/home/me'),
      path.join('/home/me', 'envs/ml/bin/python'),
    );
    assert.equal(expandInterpreterSetting('.venv/bin/python', [WORKSPACE]), path.join(WORKSPACE, '.venv/bin/python'));
    assert.equal(expandInterpreterSetting('python3.12', [WORKSPACE]), 'python3.12');
  });
});
