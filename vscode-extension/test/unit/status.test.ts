import { strict as assert } from 'node:assert';

import { formatBytes, statusView, type ExplainAnswer } from '../../src/status';

const GIB = 1024 ** 3;

function answer(
  total: number,
  gpu: { name: string; capacity_bytes: number } | null,
  fits: boolean | null,
): ExplainAnswer {
  return { uri: 'file:///work/train.py', markdown: '…', budget: { device_total_bytes: total, gpu, fits } };
}

describe('status bar text', () => {
  it('formats bytes as the server does', () => {
    assert.equal(formatBytes(25.4 * GIB), '25.4 GiB');
    assert.equal(formatBytes(512 * 1024 ** 2), '512 MiB');
    assert.equal(formatBytes(140 * GIB), '140 GiB');
    assert.equal(formatBytes(96 * 1024), '96.0 KiB');
    assert.equal(formatBytes(12), '12 B');
    assert.equal(formatBytes(-1.5 * GIB), '-1.5 GiB');
  });

  it('shows the peak against the GPU with an error icon when it does not fit', () => {
    const view = statusView(answer(25.4 * GIB, { name: 'RTX-4090', capacity_bytes: 24 * GIB }, false));
    assert.equal(view.text, '$(error) 25.4 GiB of 24.0 GiB on RTX-4090');
    assert.equal(view.verdict, 'over');
    assert.match(view.tooltip, /Does not fit: 1\.4 GiB over\./);
    assert.match(view.tooltip, /Click to choose the GPU/);
  });

  it('shows a check and the headroom when it fits', () => {
    const view = statusView(answer(61.2 * GIB, { name: 'A100-80GB', capacity_bytes: 80 * GIB }, true));
    assert.equal(view.text, '$(check) 61.2 GiB of 80.0 GiB on A100-80GB');
    assert.equal(view.verdict, 'fits');
    assert.match(view.tooltip, /Fits, 18\.8 GiB to spare\./);
  });

  it('shows the peak alone when no GPU is set', () => {
    const view = statusView(answer(9.5 * GIB, null, null));
    assert.equal(view.text, '$(info) ≈ 9.5 GiB (no GPU)');
    assert.equal(view.verdict, 'unknown');
  });

  it('names a GPU it does not know instead of saying none is set, as the code lens does', () => {
    const unknown = "unknown GPU 'A10O-80GB' (close matches: A100-80GB, H100-80GB)";
    const view = statusView({ ...answer(9.5 * GIB, null, null), problems: [unknown] });
    assert.equal(view.text, "$(warning) ≈ 9.5 GiB (unknown GPU 'A10O-80GB')");
    assert.equal(view.verdict, 'unknown');
    assert.match(view.tooltip, /close matches: A100-80GB/);
    assert.doesNotMatch(view.tooltip, /No GPU is set/);
  });

  it('says in its tooltip that the model is sized by a guess from its name', () => {
    const guess = 'The shapes of acme/SuperLlama-7B are a guess from its name';
    const view = statusView({
      ...answer(25.4 * GIB, { name: 'RTX-4090', capacity_bytes: 24 * GIB }, false),
      problems: [guess],
    });
    assert.equal(view.text, '$(error) 25.4 GiB of 24.0 GiB on RTX-4090');
    assert.ok(view.tooltip.split('\n').includes(guess), view.tooltip);
  });

  it('says why there is no estimate', () => {
    const view = statusView({ uri: 'file:///x.py', budget: null, problems: ['no model found'] });
    assert.equal(view.text, '$(question) llmmem');
    assert.match(view.tooltip, /no model found/);
    assert.equal(statusView(undefined).verdict, 'none');
    assert.match(statusView({ error: 'not an open document: file:///y.py' }).tooltip, /not an open document/);
  });
});

describe('status bar text without a server', () => {
  it('points at the output channel', () => {
    const view = statusView(undefined);
    assert.equal(view.text, '$(circle-slash) llmmem');
    assert.match(view.tooltip, /not running/);
  });
});
