/**
 * The Markdown document `llmmem: Explain` shows, from the server's `llmmem.explain` answer.
 */
import type { ExplainAnswer } from './status';

function fileName(uri: string | undefined): string {
  if (!uri) {
    return 'this file';
  }
  const path = decodeURIComponent(uri.replace(/[?#].*$/, ''));
  return path.slice(path.lastIndexOf('/') + 1) || path;
}

export function explanationTitle(answer: ExplainAnswer): string {
  return `llmmem: ${fileName(answer.uri)}`;
}

export function explanationMarkdown(answer: ExplainAnswer): string {
  const parts = [`# ${explanationTitle(answer)}`];
  if (answer.error) {
    parts.push(answer.error);
    return parts.join('\n\n') + '\n';
  }
  if (answer.markdown && answer.markdown.trim() !== '') {
    parts.push(answer.markdown.trim());
  } else {
    parts.push('No estimate for this file yet.');
  }
  const findings = answer.findings ?? [];
  if (findings.length > 0) {
    parts.push('## Findings');
    parts.push(findings.map((f) => `- **${f.code}** (${f.severity}): ${f.message}`).join('\n'));
  }
  const problems = (answer.problems ?? []).filter((p) => p.trim() !== '');
  if (problems.length > 0) {
    parts.push('## What llmmem could not read');
    parts.push(problems.map((p) => `- ${p}`).join('\n'));
  }
  return parts.join('\n\n') + '\n';
}
