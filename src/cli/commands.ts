/**
 * Every `kvtier` subcommand's definition (see options.ts): what `--help` prints, what the parser
 * accepts, and the top-level help, from one place.
 */
import { CHUNK_HASHER_DEFAULTS, MAX_CHUNK_SIZE } from '../hashing/chunk-hasher.ts';
import { KVTIER_VERSION } from '../version.ts';
import type { CommandSpec, OptionSpec } from './options.ts';

/** Default endpoint of the client commands. */
export const DEFAULT_ENDPOINT = 'tcp://127.0.0.1:5555';

const NAMESPACE: OptionSpec = {
  name: 'namespace',
  type: 'string',
  value: 'ID',
  required: true,
  help: 'namespace id, 32 hex digits (what REGISTER answers; docs/protocol.md 9.2)',
};

const JSON_OUTPUT: OptionSpec = {
  name: 'json',
  type: 'boolean',
  help: 'print one JSON object instead of text',
};

/** The options every client command has: where the sidecar is and the CurveZMQ keys. */
function clientOptions(timeoutMs: number): OptionSpec[] {
  return [
    {
      name: 'endpoint',
      type: 'string',
      value: 'ENDPOINT',
      help: 'the sidecar: tcp://HOST:PORT or ipc://PATH',
      default: DEFAULT_ENDPOINT,
      env: 'KVTIER_ENDPOINT',
    },
    {
      name: 'key-file',
      type: 'string',
      value: 'FILE',
      help: "this client's CurveZMQ secret key file (kvtier keygen; docs/security.md)",
      env: 'KVTIER_KEY_FILE',
    },
    {
      name: 'server-key',
      type: 'string',
      value: 'KEY|FILE',
      help: "the sidecar's CurveZMQ public key, Z85 text or its .pub file",
      env: 'KVTIER_SERVER_KEY',
    },
    {
      name: 'timeout-ms',
      type: 'string',
      value: 'MS',
      help: 'give up after MS milliseconds without an answer',
      default: String(timeoutMs),
    },
  ];
}

const CLIENT_FAILURE =
  '1 when the sidecar cannot be reached or refuses the request, 2 on bad flags.';
const CLIENT_EXIT = `0 on success, ${CLIENT_FAILURE}`;

const HASH_OPTIONS: OptionSpec[] = [
  {
    name: 'chunk-size',
    type: 'string',
    value: 'N',
    help: `tokens per chunk, 1..${MAX_CHUNK_SIZE}`,
    default: String(CHUNK_HASHER_DEFAULTS.chunkSize),
  },
  { name: 'salt', type: 'string', value: 'S', help: 'cache salt', default: 'empty' },
];

/** `kvtier serve`. */
export const SERVE: CommandSpec = {
  name: 'serve',
  summary: 'run the sidecar (no config needed: CPU + disk tiers, loopback endpoints)',
  description: `Runs the sidecar until SIGTERM or SIGINT. With no config at all it serves a LocalCPU tier
sized for the machine (a quarter of its memory, at most 8 GiB) over a LocalDisk tier in
$XDG_CACHE_HOME/kvtier/chunks (else ~/.cache/kvtier/chunks; a quarter of the free space, at most
32 GiB), the lookup server on ${DEFAULT_ENDPOINT} and /metrics, /healthz, /readyz on
http://127.0.0.1:9464.

Environment: KVTIER_CONFIG, KVTIER_LISTEN, KVTIER_METRICS_HOST, KVTIER_METRICS_PORT,
KVTIER_CPU_BYTES (the first tier's size), KVTIER_LOG_LEVEL, KVTIER_ALLOW_UNAUTHENTICATED,
KVTIER_EVENTS_ENDPOINT, KVTIER_EVENTS_REPLAY_ENDPOINT; without
a config file also KVTIER_DISK=off (host memory only), KVTIER_DISK_PATH, KVTIER_DISK_BYTES.
Precedence: defaults < config file < environment < flags (docs/configuration.md).`,
  options: [
    {
      name: 'config',
      type: 'string',
      value: 'FILE',
      help: 'JSON config file',
      env: 'KVTIER_CONFIG',
    },
    {
      name: 'listen',
      type: 'string',
      value: 'ENDPOINT',
      help: 'ZMQ endpoint of the lookup server',
      default: DEFAULT_ENDPOINT,
      env: 'KVTIER_LISTEN',
    },
    {
      name: 'metrics-port',
      type: 'string',
      value: 'N',
      help: 'port of /metrics, /healthz and /readyz, 0..65535 (0: any free one)',
      default: '9464',
      env: 'KVTIER_METRICS_PORT',
    },
    {
      name: 'events',
      type: 'string',
      value: 'ENDPOINT|off',
      help: "ZMQ endpoint of the event stream's PUB socket (docs/events.md); off turns it off",
      default: 'off',
      env: 'KVTIER_EVENTS_ENDPOINT',
    },
  ],
  exit: '0 after a graceful shutdown, 1 when it fails while running, 2 on a bad config or flags.',
};

/** `kvtier config check`. */
export const CONFIG_CHECK: CommandSpec = {
  name: 'config check',
  args: 'FILE',
  summary: 'check a config file as serve would, short of binding sockets',
  description: `Loads FILE as \`kvtier serve --config FILE\` would (with the KVTIER_* environment applied)
and runs every check serve runs before it binds its sockets: every tier's options; the first
tier keeps chunks in host memory; the CurveZMQ key files exist, hold keys and the secret one is
readable by its owner only; a non-loopback endpoint has keys (or security.allowUnauthenticated);
the disk, file and epoch paths can be written; every other tier's backend is built as serve
builds it (plug-ins are imported and their factories run; Redis and S3 are connected to, unless
--offline), checked and closed again.

Valid: prints the resolved config as JSON on stdout (credentials redacted; it can be given back
to serve as a config file) and exits 0. Invalid: prints each problem as
"FILE: key.path: what is wrong" on stderr (bad JSON with its line and column) and exits 1.
A tier below host memory that could not be reached (its server refused or did not answer in
time, a plug-in's start threw or did not finish) is not a problem: serve starts with it down and
it joins when it answers. Each is listed on stderr as "FILE: tiers[i]: tier NAME (TYPE) could
not be reached: why"; the check still exits 0, or 1 with --strict.`,
  options: [
    {
      name: 'offline',
      type: 'boolean',
      help: 'do not connect to Redis or S3 tiers (their options are still checked)',
    },
    {
      name: 'strict',
      type: 'boolean',
      help: 'exit 1 when a tier could not be reached, as for a problem',
    },
  ],
  positionals: { min: 1, max: 1 },
  exit: '0 valid (tiers it could not reach are listed), 1 invalid (or a tier unreachable, with --strict), 2 on bad flags.',
};

/** `kvtier hash`. */
export const HASH: CommandSpec = {
  name: 'hash',
  summary: 'hash token ids into chunk hashes (--lora, --mm for adapters and images)',
  description: `Hashes token ids with kvtier's default chunk hasher (docs/protocol.md section 9), so a miss can
be compared across languages. Reads a JSON array of token ids (integers in [0, 4294967295]) from
stdin, or from FILE with --tokens. Prints one line per chunk: <start> <end> <hash>, where tokens
[start, end) form the chunk and <hash> is 64 lowercase hex digits.`,
  options: [
    {
      name: 'tokens',
      type: 'string',
      value: 'FILE',
      help: 'read token ids from FILE instead of stdin',
    },
    ...HASH_OPTIONS,
    { name: 'lora', type: 'string', value: 'NAME', help: 'LoRA adapter name', default: 'none' },
    {
      name: 'mm',
      type: 'string',
      value: 'ID:OFFSET:LENGTH',
      multiple: true,
      help: "an extra input (e.g. an image) with id ID (its UTF-8 bytes; may contain\n':') behind prompt tokens [OFFSET, OFFSET+LENGTH)",
    },
    { name: 'partial', type: 'boolean', help: 'also hash a trailing chunk shorter than N' },
  ],
  exit: '0 on success, 2 on bad flags or input.',
};

/** `kvtier lookup`. */
export const LOOKUP: CommandSpec = {
  name: 'lookup',
  summary: 'ask the sidecar how many leading tokens of a prompt it holds',
  description: `Hashes the token ids (a JSON array, stdin or --tokens FILE) as \`kvtier hash\` does and sends
one LOOKUP without pinning, then prints the tokens cached and where they were.`,
  options: [
    NAMESPACE,
    {
      name: 'tokens',
      type: 'string',
      value: 'FILE',
      help: 'read token ids from FILE instead of stdin',
    },
    ...HASH_OPTIONS,
    { name: 'partial', type: 'boolean', help: 'also look up a trailing chunk shorter than N' },
    ...clientOptions(5000),
    JSON_OUTPUT,
  ],
  exit: CLIENT_EXIT,
};

/** `kvtier stats`. */
export const STATS: CommandSpec = {
  name: 'stats',
  summary: "print the sidecar's statistics (tiers, namespaces, lookups, queues)",
  description: `Prints the sidecar's STATS answer as indented JSON; --json prints it as one line, --human as a
table: per tier its health, chunks, bytes, fill, hit rate (chunks found of chunks looked for)
and evictions, then per namespace its chunks and bytes in each tier.`,
  options: [
    ...clientOptions(3000),
    JSON_OUTPUT,
    { name: 'human', type: 'boolean', help: 'print a readable overview instead of JSON' },
  ],
  exit: CLIENT_EXIT,
};

/** `kvtier ping`. */
export const PING: CommandSpec = {
  name: 'ping',
  summary: 'check the sidecar answers; print its version, epoch, config, limits and tiers',
  description: `Prints the sidecar's PING answer as indented JSON (--json: one line): its version, epoch,
where its config came from, each tier with its health (and path, for disk and file tiers), the
protocol limits and whether CUDA copies are available.`,
  options: [...clientOptions(3000), JSON_OUTPUT],
  exit: CLIENT_EXIT,
};

const HASH_ARG: OptionSpec = {
  name: 'hash',
  type: 'string',
  value: 'HASH',
  required: true,
  help: 'the chunk hash, 64 hex digits (kvtier hash prints them)',
};

/** `kvtier put`. */
export const PUT: CommandSpec = {
  name: 'put',
  args: '[FILE]',
  summary: "store one chunk's bytes (from FILE or stdin); needs the admin role",
  description: `Stores FILE's bytes (stdin without FILE, or with FILE "-") as the chunk HASH of namespace ID,
covering N tokens. The chunk goes to host memory and is written through to the lower tiers.`,
  options: [
    NAMESPACE,
    HASH_ARG,
    {
      name: 'token-count',
      type: 'string',
      value: 'N',
      required: true,
      help: 'tokens the chunk covers',
    },
    ...clientOptions(10_000),
    JSON_OUTPUT,
  ],
  positionals: { min: 0, max: 1 },
  exit: `0 stored (or already there), 3 dropped (no tier had room), ${CLIENT_FAILURE}`,
};

/** `kvtier get`. */
export const GET: CommandSpec = {
  name: 'get',
  summary: "write one chunk's bytes to stdout or a file",
  description: `Reads the chunk HASH of namespace ID from the first tier that has it and writes its bytes to
stdout (refused when stdout is a terminal) or to --out FILE. With --json, prints what was found
(tokens, bytes) as JSON; the bytes then go only to --out.`,
  options: [
    NAMESPACE,
    HASH_ARG,
    {
      name: 'out',
      type: 'string',
      value: 'FILE',
      help: 'write the bytes to FILE instead of stdout',
    },
    ...clientOptions(10_000),
    JSON_OUTPUT,
  ],
  exit: `0 found, 3 not found, ${CLIENT_FAILURE}`,
};

/** `kvtier clear`. */
export const CLEAR: CommandSpec = {
  name: 'clear',
  summary: "drop a namespace's chunks (or every chunk with --all) from every tier; admin role",
  description: `Drops every chunk of the namespaces given (or of all namespaces with --all) from every tier and
prints the sidecar's new epoch. Lookups running meanwhile are answered stale.`,
  options: [
    { ...NAMESPACE, multiple: true, required: false },
    { name: 'all', type: 'boolean', help: 'clear every namespace (instead of --namespace)' },
    ...clientOptions(60_000),
    JSON_OUTPUT,
  ],
  exit: CLIENT_EXIT,
};

/** `kvtier ls`. */
export const LS: CommandSpec = {
  name: 'ls',
  args: '[HASH...]',
  summary: 'list which of the given chunks a namespace holds (hashes as arguments or on stdin)',
  description: `For each chunk hash (the arguments, else one per line on stdin: a bare hash, or the
"<start> <end> <hash>" lines of \`kvtier hash\`), reads the chunk from the sidecar and prints
"<hash> <tokens> <bytes>", or "<hash> missing". Each present chunk is read whole (GET), so list a
prompt's chunks, not a store.`,
  options: [NAMESPACE, ...clientOptions(10_000), JSON_OUTPUT],
  positionals: { min: 0, max: 1_000_000 },
  exit: `0 every chunk listed, 3 some missing, ${CLIENT_FAILURE}`,
};

/** `kvtier keygen`. */
export const KEYGEN: CommandSpec = {
  name: 'keygen',
  summary: 'make a CurveZMQ key pair for the sidecar or a client',
  description: `Without --out, prints {"publicKey","secretKey"} as JSON. With --out DIR, creates DIR if needed
(mode 0700), writes DIR/NAME.key (the secret key, mode 0600, never overwritten) and DIR/NAME.pub,
and prints the public key. See docs/security.md.`,
  options: [
    { name: 'out', type: 'string', value: 'DIR', help: 'write the key files into DIR' },
    {
      name: 'name',
      type: 'string',
      value: 'NAME',
      help: 'file name of the pair',
      default: 'kvtier',
    },
  ],
  exit: '0 on success, 2 on bad flags or when a key file exists or cannot be written.',
};

/** `kvtier version`. */
export const VERSION: CommandSpec = {
  name: 'version',
  summary: 'print the version',
  options: [],
  exit: '0.',
};

/** Every command, in the order of the top-level help (`simulate` has its own parser and help). */
export const COMMANDS: readonly CommandSpec[] = [
  SERVE,
  CONFIG_CHECK,
  HASH,
  LOOKUP,
  STATS,
  PING,
  PUT,
  GET,
  CLEAR,
  LS,
  KEYGEN,
  VERSION,
];

const SIMULATE_SUMMARY = {
  name: 'simulate',
  summary: 'plan capacity: a simulated engine against a real sidecar (kvtier simulate --help)',
};

/** `kvtier --help`. */
export function topLevelHelp(): string {
  const rows = [...COMMANDS.slice(0, -1), SIMULATE_SUMMARY, COMMANDS[COMMANDS.length - 1]!];
  const width = Math.max(...rows.map((c) => c.name.length)) + 2;
  return `kvtier ${KVTIER_VERSION} — KV-cache tiering sidecar

Usage: kvtier COMMAND [options]      kvtier COMMAND --help prints a command's options

Commands:
${rows.map((c) => `  ${c.name.padEnd(width)}${c.summary}`).join('\n')}

serve starts with no config at all: a LocalCPU tier sized for the machine over a LocalDisk tier
in the user's cache directory (KVTIER_DISK=off: host memory only), the lookup server on
${DEFAULT_ENDPOINT} and /metrics, /healthz, /readyz on http://127.0.0.1:9464.
Client commands (lookup, stats, ping, put, get, clear, ls) take --endpoint (KVTIER_ENDPOINT) and,
with CurveZMQ, --key-file (KVTIER_KEY_FILE) and --server-key (KVTIER_SERVER_KEY); see
docs/security.md.
`;
}
