/**
 * The status bar verdict for the active file, from the server's `llmmem.explain` answer.
 */

/** The part of `llmmem.explain`'s answer the status bar reads. */
export interface ExplainAnswer {
  uri?: string;
  version?: number | null;
  markdown?: string;
  budget?: {
    device_total_bytes: number;
    gpu: { name: string; capacity_bytes: number } | null;
    fits: boolean | null;
    headroom_bytes?: number | null;
    peak_phase?: string;
  } | null;
  findings?: { code: string; severity: string; message: string }[];
  problems?: string[];
  error?: string;
}

export type Verdict = 'fits' | 'over' | 'unknown' | 'none';

export interface StatusView {
  text: string;
  tooltip: string;
  verdict: Verdict;
}

const KIB = 1024;
const MIB = KIB * 1024;
const GIB = MIB * 1024;

/** `25.4 GiB`, `512 MiB`: three significant figures, binary units (as the server writes them). */
export function formatBytes(bytes: number): string {
  const sign = bytes < 0 ? '-' : '';
  const size = Math.abs(bytes);
  for (const [unit, scale] of [['GiB', GIB], ['MiB', MIB], ['KiB', KIB]] as const) {
    if (size >= scale) {
      const value = size / scale;
      return `${sign}${value < 100 ? value.toFixed(1) : value.toFixed(0)} ${unit}`;
    }
  }
  return `${sign}${Math.trunc(size)} B`;
}

const CLICK = 'Click to choose the GPU.';

/** What the status bar item shows for an `llmmem.explain` answer (undefined: no server). */
export function statusView(answer: ExplainAnswer | undefined): StatusView {
  if (answer === undefined) {
    return {
      text: '$(circle-slash) llmmem',
      tooltip: 'The llmmem language server is not running: see the llmmem output channel.',
      verdict: 'none',
    };
  }
  if (answer.error !== undefined) {
    return {
      text: '$(circle-slash) llmmem',
      tooltip: `llmmem has no estimate for this file yet (${answer.error}).`,
      verdict: 'none',
    };
  }
  const budget = answer.budget;
  // what the analysis could not use (an unknown GPU, a model sized by a guess from its name):
  // the same lines the diagnostics and the code lens give
  const problems = (answer.problems ?? []).filter((line) => line.trim() !== '');
  if (!budget) {
    return {
      text: '$(question) llmmem',
      tooltip: ['llmmem cannot estimate this file yet.', ...problems, CLICK].join('\n'),
      verdict: 'none',
    };
  }
  const total = formatBytes(budget.device_total_bytes);
  if (!budget.gpu) {
    const unknown = problems.find((line) => line.startsWith('unknown GPU '));
    if (unknown !== undefined) {
      return {
        text: `$(warning) ≈ ${total} (${unknown.split(' (')[0]})`,
        tooltip: [
          `Predicted peak of one training step: ${total} as nvidia-smi would show it. Nothing is checked against a GPU's memory:`,
          ...problems,
          CLICK,
        ].join('\n'),
        verdict: 'unknown',
      };
    }
    return {
      text: `$(info) ≈ ${total} (no GPU)`,
      tooltip: [
        `Predicted peak of one training step: ${total} as nvidia-smi would show it. No GPU is set.`,
        ...problems,
        CLICK,
      ].join('\n'),
      verdict: 'unknown',
    };
  }
  const capacity = formatBytes(budget.gpu.capacity_bytes);
  const fits = budget.fits !== false && budget.device_total_bytes <= budget.gpu.capacity_bytes;
  const margin = Math.abs(budget.gpu.capacity_bytes - budget.device_total_bytes);
  const verdictLine = fits
    ? `Fits, ${formatBytes(margin)} to spare.`
    : `Does not fit: ${formatBytes(margin)} over.`;
  return {
    text: `${fits ? '$(check)' : '$(error)'} ${total} of ${capacity} on ${budget.gpu.name}`,
    tooltip: [
      `Predicted peak of one training step on ${budget.gpu.name}: ${total} of ${capacity}. ${verdictLine}`,
      ...problems,
      CLICK,
    ].join('\n'),
    verdict: fits ? 'fits' : 'over',
  };
}
