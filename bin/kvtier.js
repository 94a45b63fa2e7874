#!/usr/bin/env node
// Entry point of the `kvtier` command. Runs the compiled build (dist/, made by `npm run build`,
// which `npm ci` runs); without one, or with KVTIER_FROM_SOURCE=1, runs the TypeScript sources.
import { existsSync } from 'node:fs';

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
