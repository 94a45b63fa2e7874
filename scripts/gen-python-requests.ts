/**
 * Writes the per-message request methods of the Python package from the protocol message table
 * (src/protocol/wire-table.ts): one `encode_<message>(request_id, ...)` per request in
 * python/kvtier_vllm/protocol_encode.py, and `send_<message>(...)` plus its blocking
 * `<message>(...)` in the `RequestMethods` mixin of python/kvtier_vllm/client_requests.py, which
 * `KvtierClient` inherits. `npm run gen:protocol` (scripts/gen-protocol.ts) writes both.
 *
 * By default a request's Python parameters are its fields in wire order, snake_case, an optional
 * field `= None`, the client's the encoder's. `PYTHON_REQUESTS` (scripts/python-requests-api.ts)
 * holds where the Python API differs; a new message needs no entry there.
 */
import type { Field, MessageSpec } from '../src/protocol/wire-spec.ts';
import { MESSAGES } from '../src/protocol/wire-table.ts';
import {
  CLIENT_NAMES,
  PARAM_NAMES,
  PYTHON_REQUESTS,
  type PyHook,
  type PyParam,
  type PyRequest,
} from './python-requests-api.ts';

/** Where the generated encoders live, relative to the repository root. */
export const PY_ENCODE_PATH = 'python/kvtier_vllm/protocol_encode.py';
/** Where the generated client methods live, relative to the repository root. */
export const PY_CLIENT_PATH = 'python/kvtier_vllm/client_requests.py';

/** `camelCase` as `snake_case`. */
export const snake = (s: string): string => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
/** The Python record class of a message tag (`request-finished-result` → `RequestFinishedResult`). */
export const pascal = (tag: string): string =>
  tag === 'error'
    ? 'ErrorReply'
    : tag.replace(/(^|-)([a-z])/g, (_m, _d, c: string) => c.toUpperCase());
const hex2 = (n: number): string => `0x${n.toString(16).padStart(2, '0').toUpperCase()}`;

/** Python type of a parameter by field kind. */
const PARAM_TYPES: Record<Field['kind'], string> = {
  bool: 'bool',
  u32: 'int',
  i32: 'int',
  u64: 'int',
  enum: 'str',
  str: 'str',
  ns: 'Any',
  hash: 'Any',
  nsList: 'Sequence[Any]',
  hashes: 'Any',
  u32s: 'Any',
  json: 'dict',
  blob: 'Any',
  bytes: 'bytes',
  list: 'list',
};

const PY_KEYWORDS = new Set(
  'False None True and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield self'.split(
    ' ',
  ),
);

interface Param {
  readonly name: string;
  readonly type: string;
  readonly default?: string;
}

function parseParam(s: PyParam): Param {
  const m = /^(\w+): (.+?)(?: = (.+))?$/.exec(s);
  if (m === null)
    throw new Error(`Python parameter ${JSON.stringify(s)} is not "name: type [= default]"`);
  return m[3] === undefined
    ? { name: m[1]!, type: m[2]! }
    : { name: m[1]!, type: m[2]!, default: m[3] };
}

const spell = (p: Param): string =>
  p.default === undefined ? `${p.name}: ${p.type}` : `${p.name}: ${p.type} = ${p.default}`;

/** What the generated encoder of one request is made of. */
interface Encoder {
  readonly m: MessageSpec;
  readonly fn: string;
  /** Parameters after `request_id`, in order. */
  readonly params: readonly Param[];
  /** Field (snake_case) → the parameters that carry it. */
  readonly carries: readonly (readonly [string, readonly string[]])[];
  /** Statements before the fields are packed (the helpers' calls). */
  readonly shaping: readonly string[];
  /** Helpers of protocol_args.py called. */
  readonly helpers: readonly string[];
  /** Field (snake_case) → its value, a Python expression. */
  readonly values: readonly (readonly [string, string])[];
}

function overlayOf(m: MessageSpec): PyRequest<string> {
  return (PYTHON_REQUESTS as Record<string, PyRequest<string> | undefined>)[m.name] ?? {};
}

/** The encoder plan of request `m`. @throws Error for an overlay that does not fit the table. */
function encoderOf(m: MessageSpec): Encoder {
  const o = overlayOf(m);
  const keys = new Set(m.fields.map((f) => f.key));
  for (const k of [...Object.keys(o.fields ?? {}), ...(o.shaped ?? []).flatMap((s) => s.fields)])
    if (!keys.has(k)) throw new Error(`${m.name}: the Python API names field ${k}, which it lacks`);
  const placed: { p: Param; at: number }[] = [];
  const carries: [string, string[]][] = [];
  const values: [string, string][] = [];
  const shaping: string[] = [];
  const helpers: string[] = [];
  m.fields.forEach((f, at) => {
    const key = snake(f.key);
    const group = (o.shaped ?? []).find((s) => s.fields.includes(f.key));
    if (group !== undefined) {
      const params = group.params.map(parseParam);
      carries.push([key, params.map((p) => p.name)]);
      values.push([key, key]);
      if (group.fields[0] !== f.key) return;
      for (const p of params) placed.push({ p, at });
      const args = params.map((p) => p.name).join(', ');
      shaping.push(`${group.fields.map(snake).join(', ')} = ${group.helper}(${args})`);
      helpers.push(group.helper);
      return;
    }
    const own = o.fields?.[f.key] ?? {};
    const optional = 'optional' in f && f.optional === true;
    const name = own.name ?? PARAM_NAMES[f.key] ?? key;
    const dflt = own.default ?? (optional ? 'None' : undefined);
    const type =
      own.type ?? (dflt === 'None' ? `${PARAM_TYPES[f.kind]} | None` : PARAM_TYPES[f.kind]);
    placed.push({ p: dflt === undefined ? { name, type } : { name, type, default: dflt }, at });
    carries.push([key, [name]]);
    // An optional field whose default is not None: the default is sent as absent.
    const absent = optional && dflt !== undefined && dflt !== 'None';
    values.push([key, absent ? `None if ${name} == ${dflt} else ${name}` : name]);
  });
  // Parameters with a default follow those without (Python's rule), otherwise in wire order.
  const params = [
    ...placed.filter((x) => x.p.default === undefined),
    ...placed.filter((x) => x.p.default !== undefined),
  ].map((x) => x.p);
  const names = params.map((p) => p.name);
  for (const n of names)
    if (n === 'request_id' || PY_KEYWORDS.has(n) || names.indexOf(n) !== names.lastIndexOf(n))
      throw new Error(`${m.name}: Python parameter ${n} is reserved or repeated`);
  return { m, fn: `encode_${m.name.toLowerCase()}`, params, carries, shaping, helpers, values };
}

/** The client's `send_<message>`: its parameters, and the encoder's argument each fills. */
interface Sender {
  readonly params: readonly Param[];
  /** Encoder parameter → the client's parameter that fills it. */
  readonly args: readonly (readonly [string, string])[];
}

function senderOf(e: Encoder): Sender {
  const o = overlayOf(e.m).send ?? {};
  const all = e.params.map((p) => ({ ...p, name: CLIENT_NAMES[p.name] ?? p.name, enc: p.name }));
  const timeout = { name: 'timeout_ms', type: 'float | None', default: 'None', enc: '' };
  if (o.timeoutMs) all.push(timeout);
  let params = all;
  if (o.order !== undefined) {
    const order = o.order;
    const unknown = order.filter((n) => !all.some((p) => p.name === n));
    const missing = all.filter((p) => p.default === undefined && !order.includes(p.name));
    if (unknown.length > 0 || missing.length > 0 || (o.timeoutMs && !order.includes('timeout_ms')))
      throw new Error(`${e.m.name}: send order ${order.join(', ')} does not fit its parameters`);
    params = order.map((n) => all.find((p) => p.name === n)!);
  }
  const firstDefault = params.findIndex((p) => p.default !== undefined);
  if (firstDefault >= 0 && params.slice(firstDefault).some((p) => p.default === undefined))
    throw new Error(`${e.m.name}: send_ has a parameter without a default after one with`);
  const names = params.map((p) => p.name);
  if (new Set(names).size !== names.length)
    throw new Error(`${e.m.name}: send_ repeats a parameter`);
  return {
    params: params.map(({ enc: _e, ...p }) => p),
    args: params.filter((p) => p.enc !== '').map((p) => [p.enc, p.name] as const),
  };
}

/** `head(` args `)` on one line when it fits in `width`, else one argument a line. */
function call(
  indent: string,
  head: string,
  args: readonly string[],
  tail: string,
  width = 110,
): string[] {
  const one = `${indent}${head}(${args.join(', ')})${tail}`;
  if (one.length <= width) return [one];
  return [`${indent}${head}(`, ...args.map((a) => `${indent}    ${a},`), `${indent})${tail}`];
}

/**
 * A docstring at `indent`: `text` as paragraphs (split at blank lines; a single line break is a
 * space) wrapped at 100 columns.
 */
function docstring(indent: string, text: string): string[] {
  const width = 100 - indent.length;
  const lines: string[] = [];
  for (const para of text.split(/\n\s*\n/)) {
    if (lines.length > 0) lines.push('');
    let cur = lines.length === 0 ? '"""' : '';
    for (const w of para.split(/\s+/).filter((x) => x !== '')) {
      if (cur !== '' && cur !== '"""' && cur.length + 1 + w.length > width) {
        lines.push(cur);
        cur = w;
      } else cur = cur === '' || cur === '"""' ? `${cur}${w}` : `${cur} ${w}`;
    }
    lines.push(cur);
  }
  if (lines.length === 1 && lines[0]!.length + 3 <= width) return [`${indent}${lines[0]}"""`];
  return [...lines.map((l) => (l === '' ? '' : `${indent}${l}`)), `${indent}"""`];
}

const GENERATED = (what: string): string[] => [
  `GENERATED by scripts/gen-protocol.ts (${what}) from`,
  'src/protocol/wire-table.ts; do not edit (run ``npm run gen:protocol``).',
];

function typingImports(types: readonly string[]): string[] {
  const used = ['Any', 'Iterable', 'Sequence'].filter((t) =>
    types.some((x) => new RegExp(`\\b${t}\\b`).test(x)),
  );
  return used.length > 0 ? [`from typing import ${used.join(', ')}`, ''] : [];
}

const replyOf = (m: MessageSpec, table: readonly MessageSpec[]): MessageSpec => {
  const r = table.find((x) => x.code === (m.code | 0x80));
  if (r === undefined) throw new Error(`${m.name} has no reply`);
  return r;
};

/** What a request's Pending resolves to: the reply's one JSON object, else its record. */
function resultOf(m: MessageSpec, table: readonly MessageSpec[]): { type: string; what: string } {
  const r = replyOf(m, table);
  const only = r.fields.length === 1 ? r.fields[0] : undefined;
  if (only?.kind === 'json')
    return { type: 'dict', what: `the \`\`${snake(only.key)}\`\` object of its ${r.name}` };
  return { type: pascal(r.tag), what: `its :class:\`~.protocol_table.${pascal(r.tag)}\`` };
}

function encoderDoc(e: Encoder): string {
  const { m } = e;
  const parts = [`The ${m.name} request (${hex2(m.code)}), docs/protocol.md ${m.section}.`];
  for (const f of m.fields)
    if (f.kind === 'enum')
      parts.push(
        `\`\`${snake(f.key)}\`\`: one of ${f.names.map((n) => `\`\`'${n}'\`\``).join(', ')}.`,
      );
  const own = overlayOf(m);
  const optional = e.params.filter((p) => p.default === 'None' && /\| None$/.test(p.type));
  if (own.doc === undefined && optional.length > 0)
    parts.push(
      `${optional.map((p) => `\`\`${p.name}\`\``).join(', ')}: optional trailing fields, left out when None (one before a given one is written as 0).`,
    );
  if (own.doc !== undefined) parts.push(own.doc);
  return parts.join(' ');
}

/** `from module import names`, on one line when it fits. */
function pyImport(module: string, names: readonly string[]): string[] {
  const one = `from ${module} import ${names.join(', ')}`;
  if (one.length <= 110) return [one];
  return [`from ${module} import (`, ...names.map((n) => `    ${n},`), ')'];
}

/** One entry of a PARAMS table: `name: {field: (param, ...)}`. */
function pyDict(
  name: string,
  carries: readonly (readonly [string, readonly string[]])[],
): string[] {
  if (carries.length === 0) return [`    ${name}: {},`];
  const tuple = (ps: readonly string[]): string =>
    `(${ps.map((p) => `"${p}"`).join(', ')}${ps.length === 1 ? ',' : ''})`;
  return [`    ${name}: {`, ...carries.map(([k, ps]) => `        "${k}": ${tuple(ps)},`), '    },'];
}

const requests = (table: readonly MessageSpec[]): MessageSpec[] =>
  table.filter((m) => m.dir === 'request');

/** The text of python/kvtier_vllm/protocol_encode.py for `table` (protocol v1's by default). */
export function pythonEncoders(table: readonly MessageSpec[] = MESSAGES): string {
  const encoders = requests(table).map(encoderOf);
  const helpers = [...new Set(encoders.flatMap((e) => e.helpers))].sort();
  const out = [
    '"""Protocol v1 request encoders (docs/protocol.md), re-exported by :mod:`.protocol`: one',
    '``encode_<message>(request_id, ...)`` per request of the message table, which names the',
    "request's fields and packs them with :func:`~.protocol_pack.encode_message` (laid out by the",
    'table; what the wire cannot carry is refused before sending). Where the arguments are not the',
    'fields one for one, a hand-written helper of :mod:`.protocol_args` shapes them.',
    '',
    ...GENERATED('scripts/gen-python-requests.ts'),
    '"""',
    '',
    'from __future__ import annotations',
    '',
    ...typingImports(encoders.flatMap((e) => e.params.map((p) => p.type))),
    ...(helpers.length > 0 ? [`from .protocol_args import ${helpers.join(', ')}`] : []),
    'from .protocol_pack import encode_message',
    '',
    '__all__ = [',
    ...encoders.map((e) => `    "${e.fn}",`),
    ']',
    '',
    "#: request name -> {field: the encoder's parameters that carry it}",
    'PARAMS = {',
  ];
  for (const e of encoders) {
    out.push(...pyDict(`"${e.m.name}"`, e.carries));
  }
  out.push('}');
  for (const e of encoders) {
    out.push(
      '',
      '',
      ...call('', `def ${e.fn}`, ['request_id: int', ...e.params.map(spell)], ' -> bytes:'),
      ...docstring('    ', encoderDoc(e)),
      ...e.shaping.map((s) => `    ${s}`),
    );
    const values = e.values.map(([k, v]) => `"${k}": ${v}`);
    const dict = `{${values.join(', ')}}`;
    if (`    return encode_message("${e.m.name}", request_id, ${dict})`.length <= 110)
      out.push(`    return encode_message("${e.m.name}", request_id, ${dict})`);
    else
      out.push(
        '    values = {',
        ...values.map((v) => `        ${v},`),
        '    }',
        `    return encode_message("${e.m.name}", request_id, values)`,
      );
  }
  return `${out.join('\n')}\n`;
}

/** The text of python/kvtier_vllm/client_requests.py for `table` (protocol v1's by default). */
export function pythonClientMethods(table: readonly MessageSpec[] = MESSAGES): string {
  const encoders = requests(table).map(encoderOf);
  const senders = encoders.map(senderOf);
  const hooks = [
    ...new Set(
      encoders.flatMap((e) => {
        const s = overlayOf(e.m).send ?? {};
        return [s.before?.method, s.timeoutS?.method].filter((x) => x !== undefined);
      }),
    ),
  ];
  const results = encoders.map((e) => resultOf(e.m, table));
  const records = [
    ...new Set(
      results
        .filter((r, i) => r.type !== 'dict' && !overlayOf(encoders[i]!.m).handWrittenSync)
        .map((r) => r.type),
    ),
  ].sort();
  const out = [
    '"""The requests of :class:`~.client.KvtierClient`: for each request of the message table,',
    '``send_<message>(...)`` returns a :class:`~.pending.Pending` of its answer and the blocking',
    '``<message>(...)`` waits for it (``send_<message>(...).wait()``), over the encoders of',
    ':mod:`.protocol_encode`. The class that mixes :class:`RequestMethods` in provides',
    '``_start(msg_type, build, timeout_s)`` (:class:`~.transport.ClientTransport`)',
    hooks.length > 0
      ? `and the hand-written hooks ${hooks.map((h) => `\`\`${h}\`\``).join(', ')}.`
      : 'and nothing else.',
    '',
    ...GENERATED('scripts/gen-python-requests.ts'),
    '"""',
    '',
    'from __future__ import annotations',
    '',
    ...typingImports(senders.flatMap((s) => s.params.map((p) => p.type))),
    'from .pending import Pending',
    ...pyImport(
      '.protocol_encode',
      encoders.map((e) => e.fn),
    ),
    ...pyImport('.protocol_table', ['MsgType', ...records]),
    '',
    '#: request name -> {field: the parameters of its send_ method that carry it}',
    'SEND_PARAMS = {',
  ];
  encoders.forEach((e, i) => {
    const s = senders[i]!;
    const sent = e.carries.map(
      ([k, ps]) =>
        [k, ps.flatMap((p) => s.args.filter(([enc]) => enc === p).map(([, c]) => c))] as const,
    );
    out.push(...pyDict(`"${e.m.name}"`, sent));
  });
  out.push(
    '}',
    '',
    '',
    'class RequestMethods:',
    '    """``send_<message>`` and ``<message>`` of every request (a mixin of the client)."""',
  );
  encoders.forEach((e, i) => {
    const s = senders[i]!;
    const o = overlayOf(e.m);
    const send = o.send ?? {};
    const name = e.m.name.toLowerCase();
    const res = results[i]!;
    const doc =
      send.doc ??
      `Sends the request (:func:\`~.protocol_encode.${e.fn}\`); the Pending resolves to ${res.what}.`;
    const hook = (h: PyHook): string => `self.${h.method}(${h.args.join(', ')})`;
    const timeout = send.timeoutS
      ? hook(send.timeoutS)
      : send.timeoutMs
        ? 'None if timeout_ms is None else timeout_ms / 1000.0'
        : undefined;
    // Positional while the client's parameters are the encoder's in its order, then by keyword.
    const lead = s.args.findIndex(([enc], j) => e.params[j]?.name !== enc);
    const positional = lead < 0 ? s.args.length : lead;
    const args = s.args.map(([enc, c], j) => (j < positional ? c : `${enc}=${c}`));
    const build =
      args.length === 0 ? [e.fn] : call('', `lambda rid: ${e.fn}`, ['rid', ...args], '');
    out.push(
      '',
      ...call('    ', `def send_${name}`, ['self', ...s.params.map(spell)], ' -> Pending:'),
      ...docstring('        ', doc),
      ...(send.before ? [`        ${hook(send.before)}`] : []),
    );
    const startArgs = [
      `MsgType.${e.m.name}`,
      build.length === 1 ? build[0]! : '',
      ...(timeout ? [timeout] : []),
    ];
    if (build.length === 1) out.push(...call('        ', 'return self._start', startArgs, ''));
    else
      out.push(
        '        return self._start(',
        `            MsgType.${e.m.name},`,
        ...build.map((l, j) => `            ${l}${j === build.length - 1 ? ',' : ''}`),
        ...(timeout ? [`            ${timeout},`] : []),
        '        )',
      );
    if (o.handWrittenSync) return;
    out.push(
      '',
      ...call('    ', `def ${name}`, ['self', ...s.params.map(spell)], ` -> ${res.type}:`),
      `        """Blocking :meth:\`send_${name}\`."""`,
      ...call(
        '        ',
        `return self.send_${name}`,
        s.params.map((p) => p.name),
        '.wait()',
      ),
    );
  });
  return `${out.join('\n')}\n`;
}
