import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { formatBytes } from '../config/bytes.ts';
import { loadConfig } from '../config/config.ts';
import { isKvtierError } from '../errors.ts';
import { hashChunks } from '../hashing/chunk-hasher.ts';
import { LookupClient } from '../lookup-client/lookup-client.ts';
import { KVTIER_VERSION, Sidecar } from '../sidecar.ts';
import { runConfigCommand } from './config-command.ts';
import { runHashCommand } from './hash-command.ts';
import { clientCurveKeys, runKeygenCommand } from './keygen-command.ts';
import { processSimulateIo, runSimulateCommand } from './simulate-command.ts';

const USAGE = `kvtier ${KVTIER_VERSION} — KV-cache tiering sidecar

Usage:
  kvtier serve  [--config FILE] [--listen ENDPOINT] [--metrics-port N] [--events ENDPOINT|off]
  kvtier config check FILE   (validate a config file, print it resolved; see docs/configuration.md)
  kvtier hash   [--tokens FILE] [--chunk-size N] [--salt S] [--partial]   (tokens JSON on stdin)
  kvtier lookup --namespace ID [--tokens FILE] [--endpoint E] [--chunk-size N] [--salt S] [--partial]
  kvtier stats  [--endpoint E]
  kvtier ping   [--endpoint E]
  kvtier keygen [--out DIR] [--name NAME]   (CurveZMQ key pair: DIR/NAME.key, DIR/NAME.pub)
  kvtier simulate --workload multi-round|long-doc|trace [--sweep cpu=64M,256M,1G] [--chart FILE] ...
  kvtier version

serve starts with no config at all: one LocalCPU tier sized for the machine, the lookup server on
tcp://127.0.0.1:5555 and /metrics, /healthz, /readyz on http://127.0.0.1:9464. Environment:
KVTIER_CONFIG, KVTIER_LISTEN, KVTIER_METRICS_PORT, KVTIER_METRICS_HOST, KVTIER_CPU_BYTES,
KVTIER_LOG_LEVEL, KVTIER_ALLOW_UNAUTHENTICATED. Client commands use --endpoint or KVTIER_ENDPOINT
(default tcp://127.0.0.1:5555), and with CurveZMQ --key-file FILE (KVTIER_KEY_FILE, the client's
secret key) and --server-key KEY|FILE (KVTIER_SERVER_KEY); see docs/security.md.
`;

/** Runs the CLI; resolves the process exit code. */
export async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  try {
    switch (cmd) {
      case 'serve':
        return await serve(rest);
      case 'hash':
        return await runHashCommand(rest, {
          stdin: readStdin,
          readFile: (p) => readFile(p, 'utf8'),
          out: (l) => process.stdout.write(`${l}\n`),
          err: (l) => process.stderr.write(`${l}\n`),
        });
      case 'config':
        return await runConfigCommand(rest, {
          out: (l) => process.stdout.write(`${l}\n`),
          err: (l) => process.stderr.write(`${l}\n`),
          env: process.env,
        });
      case 'keygen':
        return await runKeygenCommand(rest, { out: (l) => process.stdout.write(`${l}\n`) });
      case 'simulate':
        return await runSimulateCommand(rest, processSimulateIo());
      case 'lookup':
        return await lookup(rest);
      case 'stats':
      case 'ping':
        return await query(cmd, rest);
      case 'version':
      case '--version':
        process.stdout.write(`${KVTIER_VERSION}\n`);
        return 0;
      case undefined:
      case 'help':
      case '--help':
      case '-h':
        process.stdout.write(USAGE);
        return cmd === undefined ? 2 : 0;
      default:
        process.stderr.write(`kvtier: unknown command "${cmd}"\n${USAGE}`);
        return 2;
    }
  } catch (err) {
    if (
      isKvtierError(err) ||
      (err as { code?: string }).code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION' ||
      (err as { code?: string }).code === 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE'
    ) {
      process.stderr.write(`kvtier ${cmd}: ${(err as Error).message}\n`);
      return isKvtierError(err) && err.code !== 'KVT_CONFIG' && err.code !== 'KVT_INVALID_ARGUMENT'
        ? 1
        : 2;
    }
    throw err;
  }
}

async function serve(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      config: { type: 'string' },
      listen: { type: 'string' },
      'metrics-port': { type: 'string' },
      events: { type: 'string' },
    },
    strict: true,
  });
  const metricsPort =
    values['metrics-port'] === undefined ? undefined : Number(values['metrics-port']);
  const config = await loadConfig({
    ...(values.config !== undefined ? { configPath: values.config } : {}),
    ...(values.listen !== undefined ? { listen: values.listen } : {}),
    ...(metricsPort !== undefined ? { metricsPort } : {}),
    ...(values.events !== undefined ? { events: values.events } : {}),
  });
  // Signal handlers come first: a SIGTERM that lands while the sidecar starts (or right as the
  // "serving on" line is read) must shut it down gracefully, not kill the process.
  let signalled: string | undefined;
  let onSignal: (signal: string) => void = (signal) => {
    signalled ??= signal;
  };
  const sigterm = () => onSignal('SIGTERM');
  const sigint = () => onSignal('SIGINT');
  process.on('SIGTERM', sigterm);
  process.on('SIGINT', sigint);
  let sidecar: Sidecar;
  try {
    sidecar = await Sidecar.start({ config });
  } catch (err) {
    process.off('SIGTERM', sigterm);
    process.off('SIGINT', sigint);
    throw err;
  }
  const cpu = config.tiers[0]!;
  if (typeof cpu.options.capacityBytes === 'number') {
    process.stderr.write(
      `kvtier: serving on ${sidecar.server.endpoint}, ${cpu.name} tier ${formatBytes(cpu.options.capacityBytes)}${sidecar.opsUrl ? `, metrics at ${sidecar.opsUrl}/metrics` : ''}\n`,
    );
  }
  return await new Promise<number>((resolve) => {
    let stopping = false;
    const stop = (signal: string) => {
      if (stopping) return;
      stopping = true;
      process.off('SIGTERM', sigterm);
      process.off('SIGINT', sigint);
      const deadline = setTimeout(() => {
        process.stderr.write(`kvtier: graceful shutdown after ${signal} took over 10 s; exiting\n`);
        resolve(1);
      }, 10_000);
      deadline.unref();
      sidecar.close().then(
        () => {
          clearTimeout(deadline);
          resolve(0);
        },
        () => resolve(1),
      );
    };
    onSignal = stop;
    if (signalled !== undefined) stop(signalled);
  });
}

function endpointOf(v: string | undefined): string {
  return v ?? process.env.KVTIER_ENDPOINT ?? 'tcp://127.0.0.1:5555';
}

async function lookup(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      endpoint: { type: 'string' },
      namespace: { type: 'string' },
      tokens: { type: 'string' },
      'chunk-size': { type: 'string', default: '256' },
      salt: { type: 'string', default: '' },
      partial: { type: 'boolean', default: false },
      'timeout-ms': { type: 'string', default: '5000' },
      'key-file': { type: 'string' },
      'server-key': { type: 'string' },
    },
    strict: true,
  });
  if (values.namespace === undefined) {
    process.stderr.write('kvtier lookup: --namespace ID (32 hex digits) is required\n');
    return 2;
  }
  const text =
    values.tokens !== undefined ? await readFile(values.tokens, 'utf8') : await readStdin();
  let tokens: unknown;
  try {
    tokens = JSON.parse(text);
  } catch {
    process.stderr.write('kvtier lookup: tokens must be a JSON array of token ids\n');
    return 2;
  }
  if (!Array.isArray(tokens)) {
    process.stderr.write('kvtier lookup: tokens must be a JSON array of token ids\n');
    return 2;
  }
  const chunks = hashChunks(tokens as number[], {
    chunkSize: Number(values['chunk-size']),
    salt: values.salt,
    partial: values.partial,
  });
  const curve = await clientCurveKeys(values, process.env);
  const client = new LookupClient({
    endpoint: endpointOf(values.endpoint),
    namespaces: [values.namespace],
    lookupTimeoutMs: Number(values['timeout-ms']),
    ...(curve !== undefined ? { curve } : {}),
  });
  try {
    const answer = await client.lookupAsync(
      `cli-${process.pid}-${Date.now()}`,
      chunks.map((c) => c.hash),
      chunks.map((c) => c.end - c.start),
      { config: { pin: false } },
    );
    if (answer.status === 'timeout') {
      process.stderr.write(
        `kvtier lookup: no answer from ${endpointOf(values.endpoint)} within ${values['timeout-ms']} ms\n`,
      );
      return 1;
    }
    const total = chunks.length === 0 ? 0 : chunks[chunks.length - 1]!.end;
    process.stdout.write(
      `${answer.hitTokens} of ${total} tokens cached (${answer.hitChunks} of ${chunks.length} chunks, epoch ${answer.epoch})\n`,
    );
    for (const t of answer.tiers) process.stdout.write(`  ${t.tier}: ${t.tokens} tokens\n`);
    return 0;
  } finally {
    await client.close();
  }
}

async function query(cmd: 'stats' | 'ping', args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      endpoint: { type: 'string' },
      'timeout-ms': { type: 'string', default: '3000' },
      'key-file': { type: 'string' },
      'server-key': { type: 'string' },
    },
    strict: true,
  });
  const endpoint = endpointOf(values.endpoint);
  const curve = await clientCurveKeys(values, process.env);
  const client = new LookupClient({
    endpoint,
    requestTimeoutMs: Number(values['timeout-ms']),
    ...(curve !== undefined ? { curve } : {}),
  });
  try {
    const info = cmd === 'stats' ? await client.stats() : await client.ping();
    process.stdout.write(`${JSON.stringify(info, null, 2)}\n`);
    return 0;
  } catch (err) {
    if (isKvtierError(err, 'KVT_TIMEOUT')) {
      process.stderr.write(
        `kvtier ${cmd}: no answer from ${endpoint} within ${values['timeout-ms']} ms\n`,
      );
      return 1;
    }
    throw err;
  } finally {
    await client.close();
  }
}

async function readStdin(): Promise<string> {
  const parts: Buffer[] = [];
  for await (const chunk of process.stdin) parts.push(chunk as Buffer);
  return Buffer.concat(parts).toString('utf8');
}
