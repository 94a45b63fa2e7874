/**
 * Runs a pytest session in a child process and reports each of its cases as a node:test test,
 * one suite per Python module, so `npm test` counts them: a pytest failure is a failed test
 * (with pytest's message), a pytest skip a skipped one (with its reason).
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { spawnGuarded } from './child-guard.ts';

/** The repository root. */
export const ROOT = new URL('../..', import.meta.url).pathname;

/** What a finished child process left. */
export interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** stdout and stderr, interleaved as they came. */
  output: string;
}

/**
 * Runs `program args` in `cwd` (default the repository root); a run past `timeoutMs` gets SIGTERM (pytest's
 * fixtures then stop the sidecars they started), then SIGKILL 10 s later.
 */
export function runProcess(
  program: string,
  args: string[],
  timeoutMs: number,
  env: NodeJS.ProcessEnv = {},
  cwd: string = ROOT,
): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawnGuarded(program, args, {
      // pytest starts sidecars of its own: its whole group goes with this process.
      group: true,
      cwd,
      env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      output += d;
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      output += d;
    });
    const timer = setTimeout(() => {
      child.kill('SIGTERM');
      setTimeout(() => child.kill('SIGKILL'), 10_000).unref();
    }, timeoutMs);
    child.once('error', (err) => {
      clearTimeout(timer);
      resolve({ code: null, signal: null, output: `${output}${err.message}` });
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, output });
    });
  });
}

/** One pytest case from the JUnit XML report. */
export interface PytestCase {
  /** Dotted module path and class, e.g. `tests.test_client` or `tests.test_x.TestY`. */
  classname: string;
  name: string;
  outcome: 'passed' | 'failed' | 'skipped';
  /** Failure or skip message (and the traceback of a failure). */
  detail: string;
}

const ENTITIES: Record<string, string> = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'" };

function unescapeXml(s: string): string {
  return s.replace(/&(#x[0-9a-fA-F]+|#\d+|[a-z]+);/g, (m, e: string) => {
    if (e.startsWith('#x')) return String.fromCodePoint(Number.parseInt(e.slice(2), 16));
    if (e.startsWith('#')) return String.fromCodePoint(Number.parseInt(e.slice(1), 10));
    return ENTITIES[e] ?? m;
  });
}

function attr(attrs: string, name: string): string {
  const m = new RegExp(`\\b${name}="([^"]*)"`).exec(attrs);
  return m === null ? '' : unescapeXml(m[1]!);
}

/** Reads the test cases of a pytest JUnit XML report (the subset pytest writes). */
export function parseJunitXml(xml: string): PytestCase[] {
  const cases: PytestCase[] = [];
  const re = /<testcase\b([^>]*?)(?:\/>|>([\s\S]*?)<\/testcase>)/g;
  for (let m = re.exec(xml); m !== null; m = re.exec(xml)) {
    const attrs = m[1]!;
    const body = m[2] ?? '';
    const classname = attr(attrs, 'classname');
    const name = attr(attrs, 'name');
    const bad = /<(failure|error)\b([^>]*?)(?:\/>|>([\s\S]*?)<\/\1>)/.exec(body);
    const skip = /<skipped\b([^>]*?)(?:\/>|>([\s\S]*?)<\/skipped>)/.exec(body);
    if (bad !== null) {
      const what = bad[1] === 'error' ? 'error' : 'failure';
      cases.push({
        classname,
        name,
        outcome: 'failed',
        detail: `${what}: ${attr(bad[2]!, 'message')}\n${unescapeXml(bad[3] ?? '')}`.trim(),
      });
    } else if (skip !== null) {
      cases.push({
        classname,
        name,
        outcome: 'skipped',
        detail: attr(skip[1]!, 'message') || unescapeXml(skip[2] ?? '').trim() || 'skipped',
      });
    } else {
      cases.push({ classname, name, outcome: 'passed', detail: '' });
    }
  }
  return cases;
}

/** Options of {@link runPytestSuites}. */
export interface PytestSuitesOptions {
  /** The interpreter. */
  python: string;
  /** pytest's arguments besides the JUnit report (paths, -p, -k ...). */
  args: string[];
  timeoutMs: number;
  /** Names the run in the closing test, e.g. `pytest python/tests`. */
  label: string;
  env?: NodeJS.ProcessEnv;
  /** Working directory of pytest; default the repository root. */
  cwd?: string;
  /**
   * How a module's path (`tests/test_x`, from pytest's dotted class name) is shown; default: as
   * a path under python/ (`python/tests/test_x`).
   */
  moduleName?: (path: string) => string;
}

/**
 * Runs pytest and registers one node:test suite per Python module plus a closing test that
 * fails when pytest itself failed (killed, crashed, no cases). Returns the run (its output,
 * e.g. for lines a test printed).
 */
export async function runPytestSuites(opts: PytestSuitesOptions): Promise<Run> {
  const dir = mkdtempSync(join(tmpdir(), 'kvtier-pytest-'));
  const xmlPath = join(dir, 'junit.xml');
  const started = Date.now();
  const res = await runProcess(
    opts.python,
    ['-m', 'pytest', ...opts.args, '--junitxml', xmlPath],
    opts.timeoutMs,
    opts.env,
    opts.cwd,
  );
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  const xml = existsSync(xmlPath) ? readFileSync(xmlPath, 'utf8') : '';
  rmSync(dir, { recursive: true, force: true });
  const cases = parseJunitXml(xml);
  const tail = res.output.split('\n').slice(-60).join('\n');

  const modules = new Map<string, PytestCase[]>();
  for (const c of cases) {
    const parts = c.classname.split('.');
    const modParts = parts.findIndex((p) => p.startsWith('test_'));
    const path = parts.slice(0, modParts < 0 ? 2 : modParts + 1).join('/');
    const mod = (opts.moduleName ?? ((m: string) => m.replace(/^tests\//, 'python/tests/')))(path);
    const list = modules.get(mod) ?? [];
    list.push(c);
    modules.set(mod, list);
  }
  for (const [mod, list] of modules) {
    describe(`pytest ${mod}.py`, () => {
      for (const c of list) {
        const parts = c.classname.split('.');
        const at = parts.findIndex((p) => p.startsWith('test_'));
        const inner = at < 0 ? '' : parts.slice(at + 1).join('.');
        const title = inner === '' ? c.name : `${inner}::${c.name}`;
        if (c.outcome === 'skipped') it(title, { skip: c.detail }, () => {});
        else
          it(title, () => {
            if (c.outcome === 'failed') assert.fail(`${title}\n${c.detail}`);
          });
      }
    });
  }
  describe('pytest run', () => {
    it(`${opts.label} finished (${cases.length} cases in ${seconds} s)`, () => {
      assert.ok(
        res.signal === null && res.code !== null,
        `pytest was killed (${res.signal ?? 'error'}; limit ${opts.timeoutMs / 60_000} min):\n${tail}`,
      );
      // 0: all passed; 1: some failed (reported above). Anything else is pytest itself failing.
      assert.ok(res.code === 0 || res.code === 1, `pytest exited with ${res.code}:\n${tail}`);
      assert.ok(cases.length > 0, `pytest reported no test cases:\n${tail}`);
      if (res.code === 1)
        assert.ok(
          cases.some((c) => c.outcome === 'failed'),
          `pytest exited with 1 but reported no failed case:\n${tail}`,
        );
    });
  });
  return res;
}
