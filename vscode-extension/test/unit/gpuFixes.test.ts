import { strict as assert } from 'node:assert';
import type * as vscode from 'vscode';

import { gpuSettingFixes } from '../../src/gpuFixes';

/** The diagnostic the server publishes for `llmmem.gpu: "A10O-80GB"` (its `data` as sent). */
function unknownGpu(suggestions: unknown[]): vscode.Diagnostic {
  return {
    message: "Unknown GPU 'A10O-80GB' in the llmmem.gpu setting: did you mean A100-80GB, H100-80GB?",
    source: 'llmmem',
    data: { setting: 'llmmem.gpu', gpu: 'A10O-80GB', suggestions },
  } as unknown as vscode.Diagnostic;
}

describe('quick fixes for an unknown GPU in the llmmem.gpu setting', () => {
  it('offers each close match, writing it through Select GPU', () => {
    const diagnostic = unknownGpu(['A100-80GB', 'H100-80GB']);
    const actions = gpuSettingFixes([diagnostic]);
    assert.deepEqual(
      actions.map((action) => action.title),
      ['Set llmmem.gpu to A100-80GB (instead of A10O-80GB)', 'Set llmmem.gpu to H100-80GB (instead of A10O-80GB)'],
    );
    assert.equal(actions[0]!.kind?.value, 'quickfix');
    assert.deepEqual(actions[0]!.diagnostics, [diagnostic]);
    assert.equal(actions[0]!.command?.command, 'llmmem.selectGpu');
    assert.deepEqual(actions[0]!.command?.arguments, ['A100-80GB']);
  });

  it('offers nothing for other diagnostics, and each match once', () => {
    const finding = { message: 'Will not fit', source: 'llmmem', code: 'LLM001' } as unknown as vscode.Diagnostic;
    const pragma = { message: "unknown GPU 'A100-80B'", data: { setting: 'other' } } as unknown as vscode.Diagnostic;
    assert.deepEqual(gpuSettingFixes([finding, pragma]), []);
    const twice = gpuSettingFixes([unknownGpu(['A100-80GB', 7]), unknownGpu(['A100-80GB'])]);
    assert.deepEqual(twice.map((action) => action.command?.arguments), [['A100-80GB']]);
  });
});
