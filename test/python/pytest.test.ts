/**
 * Runs the Python package's tests (python/tests, pytest) once and reports every pytest case as
 * a node:test test, one suite per Python module, so `npm test` counts them in its summary: a
 * pytest failure is a failed test here (with pytest's message), a pytest skip a skipped one
 * (with its reason).
 *
 * Only Debian's interpreter is used (/usr/bin/python3 with python3-zmq, python3-numpy and
 * python3-pytest); without them this file fails with one line saying what to install.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';

const ROOT = new URL('../..', import.meta.url).pathname;
const PYTHON = '/usr/bin/python3';
const INSTALL_HINT = 'apt-get install python3-zmq python3-numpy python3-pytest';
/** A hung pytest run fails after this long instead of holding CI. */
const PYTEST_TIMEOUT_MS = 15 * 60_000;

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

function run(args: string[], timeoutMs: number): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(PYTHON, args, {
      cwd: ROOT,
      env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      output += d;
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      output += d;
    });
    // SIGTERM first: pytest's fixtures then stop the sidecars they started.
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

async function prerequisites(): Promise<string | null> {
  if (!existsSync(PYTHON)) return `${PYTHON} not found: ${INSTALL_HINT}`;
  const probe = await run(
    [
      '-c',
      'import importlib.util as u, sys; m=[n for n in ("zmq","numpy","pytest") if u.find_spec(n) is None]; print(",".join(m)); sys.exit(1 if m else 0)',
    ],
    60_000,
  );
  if (probe.code === 0) return null;
  const missing = probe.output.trim().split('\n').pop() ?? '?';
  return `${PYTHON} lacks the Python modules ${missing}: ${INSTALL_HINT}`;
}

const missing = await prerequisites();
if (missing !== null) {
  describe('python tests (pytest)', () => {
    it('Python prerequisites are installed', () => {
      assert.fail(missing);
    });
  });
} else {
  const dir = mkdtempSync(join(tmpdir(), 'kvtier-pytest-'));
  const xmlPath = join(dir, 'junit.xml');
  const started = Date.now();
  const res = await run(
    [
      '-m',
      'pytest',
      'python/tests',
      '-q',
      '-p',
      'no:cacheprovider',
      '-rfEs',
      '--junitxml',
      xmlPath,
    ],
    PYTEST_TIMEOUT_MS,
  );
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  const xml = existsSync(xmlPath) ? readFileSync(xmlPath, 'utf8') : '';
  rmSync(dir, { recursive: true, force: true });
  const cases = parseJunitXml(xml);
  const tail = res.output.split('\n').slice(-60).join('\n');

  // One suite per Python module, in pytest's order.
  const modules = new Map<string, PytestCase[]>();
  for (const c of cases) {
    const mod = c.classname
      .split('.')
      .slice(0, 2)
      .join('.')
      .replace(/^tests\./, 'python/tests/');
    const list = modules.get(mod) ?? [];
    list.push(c);
    modules.set(mod, list);
  }
  for (const [mod, list] of modules) {
    describe(`pytest ${mod}.py`, () => {
      for (const c of list) {
        const inner = c.classname.split('.').slice(2).join('.');
        const title = inner === '' ? c.name : `${inner}::${c.name}`;
        if (c.outcome === 'skipped') it(title, { skip: c.detail }, () => {});
        else
          it(title, () => {
            if (c.outcome === 'failed') assert.fail(`${title}\n${c.detail}`);
          });
      }
    });
  }
  // Figures some tests print for the record (python/tests/test_router_events.py).
  const figures = res.output.split('\n').filter((l) => l.startsWith('router events: '));
  describe('pytest figures', () => {
    for (const line of figures) it(line, () => {});
  });
  describe('pytest run', () => {
    it(`pytest python/tests finished (${cases.length} cases in ${seconds} s)`, () => {
      assert.ok(
        res.signal === null && res.code !== null,
        `pytest was killed (${res.signal ?? 'error'}; limit ${PYTEST_TIMEOUT_MS / 60_000} min):\n${tail}`,
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
}
