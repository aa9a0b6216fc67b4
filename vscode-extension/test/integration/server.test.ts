/**
 * The client's pieces (src/client.ts, src/config.ts) against the real Python server over stdio,
 * without VS Code: initialize with the options the extension sends, answer
 * `workspace/configuration` with its middleware, and check diagnostics, a hover, a quick fix,
 * the commands the status bar and the GPU picker use, and a settings change.
 *
 * Python: $LLMMEM_PYTHON, else python3. When it cannot import llmmem_lsp the tests are skipped,
 * unless $CI or LLMMEM_REQUIRE_SERVER=1 is set: then they fail and say why.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';
import { strict as assert } from 'node:assert';
import {
  CodeActionRequest,
  ConfigurationRequest,
  DidChangeConfigurationNotification,
  DidOpenTextDocumentNotification,
  DocumentDiagnosticRequest,
  ExecuteCommandRequest,
  ExitNotification,
  HoverRequest,
  InitializeRequest,
  InitializedNotification,
  PublishDiagnosticsNotification,
  RegistrationRequest,
  ShowMessageNotification,
  ShutdownRequest,
  WorkDoneProgressCreateRequest,
  createProtocolConnection,
  StreamMessageReader,
  StreamMessageWriter,
  type ClientCapabilities,
  type CodeAction,
  type Command,
  type Diagnostic,
  type MarkupContent,
  type ProtocolConnection,
  type PublishDiagnosticsParams,
} from 'vscode-languageserver-protocol/node';

import {
  SERVER_COMMANDS,
  checkServerInstalled,
  createMiddleware,
  initializationOptions,
  serverExecutable,
  type ServerCheck,
} from '../../src/client';
import { REPOSITORY_ROOT } from '../paths';
import { readerOf, serverSettings, type ServerSettings } from '../../src/config';
import { statusView, type ExplainAnswer } from '../../src/status';

const PYTHON = process.env.LLMMEM_PYTHON || 'python3';
const REQUIRED = Boolean(process.env.CI) || process.env.LLMMEM_REQUIRE_SERVER === '1';
const EXAMPLE = path.join(REPOSITORY_ROOT, 'examples', 'qlora_sft.py');
const WAIT_MS = 60_000;

/** A client session with the server, speaking for the extension. */
class Session {
  readonly diagnostics = new Map<string, PublishDiagnosticsParams[]>();
  readonly configurationRequests: unknown[] = [];
  readonly messages: string[] = [];
  private waiters: (() => void)[] = [];
  private stderr = '';

  private constructor(
    readonly process: ChildProcess,
    readonly connection: ProtocolConnection,
    public settings: ServerSettings,
  ) {}

  static async start(settings: ServerSettings, capabilities: ClientCapabilities, root: string): Promise<Session> {
    const executable = serverExecutable(PYTHON, { ...process.env, HF_HUB_OFFLINE: '1' }, root);
    const child = spawn(executable.command, executable.args, { ...executable.options, stdio: 'pipe' });
    const connection = createProtocolConnection(
      new StreamMessageReader(child.stdout),
      new StreamMessageWriter(child.stdin),
    );
    const session = new Session(child, connection, settings);
    child.stderr.on('data', (chunk: Buffer) => {
      session.stderr += chunk.toString();
    });
    const middleware = createMiddleware(() => session.settings);
    connection.onRequest(ConfigurationRequest.type, (params, token) => {
      session.configurationRequests.push(params);
      return middleware.workspace.configuration(params, token, (p) => p.items.map(() => null));
    });
    connection.onRequest(RegistrationRequest.type, () => undefined);
    connection.onRequest(WorkDoneProgressCreateRequest.type, () => undefined);
    connection.onNotification(ShowMessageNotification.type, (params) => {
      session.messages.push(params.message);
    });
    connection.onNotification(PublishDiagnosticsNotification.type, (params) => {
      const list = session.diagnostics.get(params.uri) ?? [];
      list.push(params);
      session.diagnostics.set(params.uri, list);
      session.waiters.splice(0).forEach((wake) => wake());
    });
    connection.listen();
    await connection.sendRequest(InitializeRequest.type, {
      processId: process.pid,
      rootUri: pathToFileURL(root).href,
      workspaceFolders: [{ uri: pathToFileURL(root).href, name: 'work' }],
      capabilities,
      initializationOptions: initializationOptions(settings),
    });
    await connection.sendNotification(InitializedNotification.type, {});
    return session;
  }

  /** Waits for published diagnostics of `uri` that satisfy `accept`. */
  async published(uri: string, accept: (params: PublishDiagnosticsParams) => boolean): Promise<Diagnostic[]> {
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      const found = (this.diagnostics.get(uri) ?? []).find(accept);
      if (found) {
        return found.diagnostics;
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new Error(`no matching diagnostics for ${uri} in ${WAIT_MS} ms; server log:\n${this.stderr}`);
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 1_000));
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  async open(file: string, text: string): Promise<string> {
    const uri = pathToFileURL(file).href;
    await this.connection.sendNotification(DidOpenTextDocumentNotification.type, {
      textDocument: { uri, languageId: 'python', version: 1, text },
    });
    return uri;
  }

  async stop(): Promise<void> {
    try {
      await this.connection.sendRequest(ShutdownRequest.type);
      await this.connection.sendNotification(ExitNotification.type);
    } catch {
      // already gone
    }
    const exited = new Promise((resolve) => this.process.once('exit', resolve));
    const timer = setTimeout(() => this.process.kill(), 5_000);
    await exited;
    clearTimeout(timer);
    this.connection.dispose();
  }
}

/** What vscode-languageclient 9 announces that matters here, with diagnostics pushed or pulled. */
function capabilities(pull: boolean): ClientCapabilities {
  return {
    textDocument: {
      synchronization: { didSave: true },
      publishDiagnostics: { relatedInformation: true, versionSupport: true, codeDescriptionSupport: true },
      ...(pull ? { diagnostic: { relatedDocumentSupport: false } } : {}),
      hover: { contentFormat: ['markdown', 'plaintext'] },
      codeAction: { codeActionLiteralSupport: { codeActionKind: { valueSet: ['quickfix'] } } },
    },
    workspace: {
      configuration: true,
      workspaceEdit: { documentChanges: true },
      didChangeConfiguration: {},
    },
    window: { workDoneProgress: true },
  };
}

function positionOf(text: string, needle: string): { line: number; character: number } {
  const lines = text.split('\n');
  const line = lines.findIndex((l) => l.includes(needle));
  assert.ok(line >= 0, `"${needle}" in the example`);
  return { line, character: lines[line]!.indexOf(needle) + 2 };
}

describe('the llmmem server, driven by the extension client code', function () {
  this.timeout(WAIT_MS + 30_000);
  let workdir: string;
  let script: string;
  let text: string;

  before(async function () {
    const check: ServerCheck = await checkServerInstalled(PYTHON, 60_000);
    if (!check.ok) {
      const why = `${PYTHON} -c "import llmmem_lsp" failed: ${check.detail}`;
      if (REQUIRED) {
        throw new Error(
          `the llmmem language server cannot start: ${why}. Install it there (pip install -e '.[test]' ` +
            'from the repository root) or point LLMMEM_PYTHON at a Python that has it.',
        );
      }
      console.warn(
        `skipping the protocol tests: ${why}; set LLMMEM_PYTHON to a Python with llmmem installed, ` +
          'or LLMMEM_REQUIRE_SERVER=1 to fail instead',
      );
      this.skip();
    }
    workdir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmmem-client-'));
    script = path.join(workdir, 'qlora_sft.py');
    text = fs.readFileSync(EXAMPLE, 'utf-8');
    fs.writeFileSync(script, text);
  });

  after(() => {
    if (workdir) {
      fs.rmSync(workdir, { recursive: true, force: true });
    }
  });

  describe('with pushed diagnostics', () => {
    let session: Session;
    let uri: string;

    before(async () => {
      session = await Session.start(serverSettings(readerOf({ gpu: 'RTX-4090' })), capabilities(false), workdir);
      uri = await session.open(script, text);
    });

    after(async () => {
      await session?.stop();
    });

    it('pulls its settings through the middleware', async () => {
      await session.published(uri, (p) => p.diagnostics.length > 0);
      assert.ok(session.configurationRequests.length > 0);
      assert.deepEqual(
        session.messages.filter((m) => m.includes('llmmem.')),
        [],
      );
    });

    it('publishes LLM001 "Will not fit RTX-4090"', async () => {
      const diagnostics = await session.published(uri, (p) => p.diagnostics.some((d) => d.code === 'LLM001'));
      const fit = diagnostics.find((d) => d.code === 'LLM001')!;
      assert.match(fit.message, /Will not fit RTX-4090/);
      assert.equal(fit.source, 'llmmem');
    });

    it('hovers the micro-batch with the breakdown on RTX-4090', async () => {
      await session.published(uri, (p) => p.diagnostics.length > 0);
      const hover = await session.connection.sendRequest(HoverRequest.type, {
        textDocument: { uri },
        position: positionOf(text, 'per_device_train_batch_size'),
      });
      assert.ok(hover);
      const contents = hover.contents as MarkupContent;
      assert.equal(contents.kind, 'markdown');
      assert.ok(contents.value.includes('on RTX-4090'), contents.value);
    });

    it('offers a quick fix titled with the total after it, carrying its edit', async () => {
      const diagnostics = await session.published(uri, (p) => p.diagnostics.some((d) => d.code === 'LLM001'));
      const fit = diagnostics.find((d) => d.code === 'LLM001')!;
      const actions: (CodeAction | Command)[] | null = await session.connection.sendRequest(
        CodeActionRequest.type,
        { textDocument: { uri }, range: fit.range, context: { diagnostics: [fit], only: ['quickfix'] } },
      );
      const fixes = (actions ?? []).filter((a): a is CodeAction => 'edit' in a || 'kind' in a);
      const arrow = fixes.filter((a) => a.title.includes('→'));
      assert.ok(arrow.length > 0, `titles: ${fixes.map((a) => a.title).join(' | ')}`);
      const edit = arrow[0]!.edit;
      assert.ok(edit, 'the fix carries a WorkspaceEdit');
      const changes = edit.documentChanges ?? Object.values(edit.changes ?? {});
      assert.ok(changes.length > 0);
    });

    it('lists each quick fix once over the whole trainer configuration (the Liger fix answers two findings)', async () => {
      const diagnostics = await session.published(uri, (p) => p.diagnostics.some((d) => d.code === 'LLM001'));
      const start = positionOf(text, 'training_args = SFTConfig(');
      const end = positionOf(text, 'dataset = load_dataset(');
      const actions: (CodeAction | Command)[] | null = await session.connection.sendRequest(
        CodeActionRequest.type,
        { textDocument: { uri }, range: { start, end }, context: { diagnostics, only: ['quickfix'] } },
      );
      const titles = (actions ?? []).map((a) => a.title);
      assert.ok(titles.length > 0);
      assert.equal(new Set(titles).size, titles.length, `titles: ${titles.join(' | ')}`);
      assert.ok(titles.filter((t) => /Liger/i.test(t)).length <= 1, titles.join(' | '));
    });

    it('answers llmmem.explain with what the status bar shows', async () => {
      await session.published(uri, (p) => p.diagnostics.length > 0);
      const answer = (await session.connection.sendRequest(ExecuteCommandRequest.type, {
        command: SERVER_COMMANDS.explain,
        arguments: [uri],
      })) as ExplainAnswer;
      assert.equal(answer.budget?.gpu?.name, 'RTX-4090');
      assert.equal(answer.budget?.fits, false);
      assert.match(answer.markdown ?? '', /RTX-4090/);
      const view = statusView(answer);
      assert.equal(view.verdict, 'over');
      assert.match(view.text, /^\$\(error\) \d+\.\d GiB of 24\.0 GiB on RTX-4090$/);
    });

    it('answers llmmem.gpus with the catalog the GPU picker lists', async () => {
      const gpus = (await session.connection.sendRequest(ExecuteCommandRequest.type, {
        command: SERVER_COMMANDS.gpus,
        arguments: [],
      })) as { name: string; memoryGiB: number; bf16: boolean }[];
      const rtx = gpus.find((g) => g.name === 'RTX-4090');
      assert.ok(rtx);
      assert.ok(Math.abs(rtx.memoryGiB - 24) < 0.5, String(rtx.memoryGiB));
    });

    it('pulls the settings again after a change and re-analyses', async () => {
      await session.published(uri, (p) => p.diagnostics.some((d) => d.code === 'LLM001'));
      const asked = session.configurationRequests.length;
      const before = session.diagnostics.get(uri)?.length ?? 0;
      session.settings = serverSettings(readerOf({ gpu: 'H100' }));
      await session.connection.sendNotification(DidChangeConfigurationNotification.type, {
        settings: { llmmem: initializationOptions(session.settings) },
      });
      const after = await session.published(
        uri,
        (p) => (session.diagnostics.get(uri)?.indexOf(p) ?? 0) >= before,
      );
      assert.ok(session.configurationRequests.length > asked);
      assert.equal(
        after.some((d) => d.code === 'LLM001'),
        false,
      );
      const answer = (await session.connection.sendRequest(ExecuteCommandRequest.type, {
        command: SERVER_COMMANDS.explain,
        arguments: [uri],
      })) as ExplainAnswer;
      assert.match(answer.budget?.gpu?.name ?? '', /^H100/);
      assert.equal(statusView(answer).verdict, 'fits');
    });
  });

  describe('with pulled diagnostics (as VS Code asks for them)', () => {
    let session: Session;

    before(async () => {
      session = await Session.start(serverSettings(readerOf({ gpu: 'RTX-4090' })), capabilities(true), workdir);
    });

    after(async () => {
      await session?.stop();
    });

    it('reports LLM001 in textDocument/diagnostic', async () => {
      const uri = await session.open(script, text);
      const deadline = Date.now() + WAIT_MS;
      let codes: unknown[] = [];
      while (Date.now() < deadline) {
        const report = await session.connection.sendRequest(DocumentDiagnosticRequest.type, {
          textDocument: { uri },
        });
        codes = 'items' in report ? report.items.map((d) => d.code) : [];
        if (codes.includes('LLM001')) {
          break;
        }
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      assert.ok(codes.includes('LLM001'), JSON.stringify(codes));
    });
  });
});
