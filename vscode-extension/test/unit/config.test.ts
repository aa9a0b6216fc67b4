import { strict as assert } from 'node:assert';

import { initializationOptions } from '../../src/client';
import { DEFAULT_SERVER_SETTINGS, readerOf, serverSettings } from '../../src/config';

describe('settings → initializationOptions', () => {
  it('sends every key the server reads, with its default, when nothing is set', () => {
    assert.deepEqual(initializationOptions(serverSettings(readerOf({}))), {
      gpu: null,
      worldSize: null,
      hub: true,
      hubTimeoutSeconds: 3,
      severity: {},
      debounceMs: 300,
      analysisTimeoutSeconds: 10,
      detectGpu: true,
    });
  });

  it('carries the user settings under the camelCase keys, and not the interpreter', () => {
    const options = initializationOptions(
      serverSettings(
        readerOf({
          gpu: ' A100-80GB ',
          worldSize: 8,
          hub: false,
          hubTimeoutSeconds: 1.5,
          severity: { LLM002: 'info', LLM005: 'off' },
          debounceMs: 0,
          analysisTimeoutSeconds: 30,
          detectGpu: false,
          interpreter: '/opt/venv/bin/python',
        }),
      ),
    );
    assert.deepEqual(options, {
      gpu: 'A100-80GB',
      worldSize: 8,
      hub: false,
      hubTimeoutSeconds: 1.5,
      severity: { LLM002: 'info', LLM005: 'off' },
      debounceMs: 0,
      analysisTimeoutSeconds: 30,
      detectGpu: false,
    });
  });

  it('sends null for a cleared GPU and world size, so the server forgets them', () => {
    const options = serverSettings(readerOf({ gpu: '', worldSize: 0 }));
    assert.equal(options.gpu, null);
    assert.equal(options.worldSize, null);
    assert.ok('gpu' in options && 'worldSize' in options);
  });

  it('falls back to the defaults for values of the wrong type', () => {
    const options = serverSettings(
      readerOf({
        gpu: 24,
        worldSize: 1.5,
        hub: 'yes',
        severity: ['LLM001'],
        debounceMs: 'x',
        analysisTimeoutSeconds: 'long',
      }),
    );
    assert.deepEqual(options, { ...DEFAULT_SERVER_SETTINGS });
  });

  it('copies the severity map, so later edits do not leak into what was sent', () => {
    const severity = { LLM001: 'warning' };
    const options = initializationOptions(serverSettings(readerOf({ severity })));
    severity.LLM001 = 'off';
    assert.deepEqual(options.severity, { LLM001: 'warning' });
  });
});
