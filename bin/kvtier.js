#!/usr/bin/env node
// Entry point of the `kvtier` command. Runs the compiled build (dist/, made by `npm run build`,
// which `npm ci` runs); without one, or with KVTIER_FROM_SOURCE=1, runs the TypeScript sources.
import { existsSync } from 'node:fs';

// Device copies each hold a libuv pool thread while they wait for the GPU, and the file tiers'
// reads share that pool: 16 threads instead of libuv's 4 unless UV_THREADPOOL_SIZE says otherwise.
// libuv reads it when the pool starts; Node 24 loads an ES module entry without the pool, so the
// pool starts after this line (on Node 20 it already has; the data plane reads the variable to
// size its copy window, so it is set only where it takes effect).
if (
  process.env.UV_THREADPOOL_SIZE === undefined &&
  Number(process.versions.node.split('.')[0]) >= 24
)
  process.env.UV_THREADPOOL_SIZE = '16';

// Node's process warnings (the AWS SDK's notice on Node 20 when a command builds an S3 tier) as
// one line on stderr instead of Node's text over several lines; `serve` logs them as JSON lines.
process.removeAllListeners('warning');
process.on('warning', (w) => {
  const name = w.name === 'Warning' ? '' : `${w.name}: `;
  process.stderr.write(`kvtier: warning: ${name}${w.message.replace(/\s*\n\s*/g, ' ')}\n`);
});

const compiled = new URL('../dist/src/cli/main.js', import.meta.url);
let main;
if (process.env.KVTIER_FROM_SOURCE !== '1' && existsSync(compiled)) {
  ({ main } = await import(compiled.href));
} else {
  const { register } = await import('tsx/esm/api');
  register();
  ({ main } = await import('../src/cli/main.ts'));
}
// A reader that went away (`kvtier ls ... | head -1`) ends the command quietly, as SIGPIPE ends
// other command-line tools, instead of an unhandled EPIPE with a stack trace.
process.stdout.on('error', (err) => {
  if (err.code !== 'EPIPE') throw err;
  process.exit(process.exitCode ?? 0);
});
process.exitCode = await main(process.argv.slice(2));
