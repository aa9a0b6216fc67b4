/**
 * Quick fixes for a GPU name in the `llmmem.gpu` setting that names no GPU: the server says so
 * at the top of each file, with the catalog's close matches in the diagnostic's `data`, but it
 * cannot write the editor's settings. Each close match becomes a fix that writes it there
 * (`llmmem.selectGpu` with the name), at the level the setting has.
 */
import * as vscode from 'vscode';

import { EXTENSION_COMMANDS, LANGUAGES } from './client';

/** What the server puts in `data` of that diagnostic. */
interface GpuSettingProblem {
  gpu: string;
  suggestions: string[];
}

function gpuSettingProblem(diagnostic: vscode.Diagnostic): GpuSettingProblem | undefined {
  const data = (diagnostic as { data?: unknown }).data;
  if (typeof data !== 'object' || data === null) {
    return undefined;
  }
  const { setting, gpu, suggestions } = data as Record<string, unknown>;
  if (setting !== 'llmmem.gpu' || typeof gpu !== 'string' || !Array.isArray(suggestions)) {
    return undefined;
  }
  return { gpu, suggestions: suggestions.filter((name): name is string => typeof name === 'string') };
}

/** One fix per close match, each once, for the diagnostics a code action request names. */
export function gpuSettingFixes(diagnostics: readonly vscode.Diagnostic[]): vscode.CodeAction[] {
  const actions: vscode.CodeAction[] = [];
  const seen = new Set<string>();
  for (const diagnostic of diagnostics) {
    const problem = gpuSettingProblem(diagnostic);
    for (const name of problem?.suggestions ?? []) {
      if (seen.has(name)) {
        continue;
      }
      seen.add(name);
      const title = `Set llmmem.gpu to ${name} (instead of ${problem!.gpu})`;
      const action = new vscode.CodeAction(title, vscode.CodeActionKind.QuickFix);
      action.diagnostics = [diagnostic];
      action.command = { title, command: EXTENSION_COMMANDS.selectGpu, arguments: [name] };
      actions.push(action);
    }
  }
  return actions;
}

/** Every file the server reads: cells of notebooks are Python documents too. */
export const GPU_FIX_SELECTOR: vscode.DocumentSelector = LANGUAGES.map((language) => ({ language }));

export const gpuSettingFixProvider: vscode.CodeActionProvider = {
  provideCodeActions: (_document, _range, context) => gpuSettingFixes(context.diagnostics),
};
