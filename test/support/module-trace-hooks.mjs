// Module hooks of module-trace.mjs: appends each resolved URL to KVTIER_TRACE_MODULES.
import { appendFileSync } from 'node:fs';

const file = process.env.KVTIER_TRACE_MODULES;

export async function resolve(specifier, context, next) {
  const r = await next(specifier, context);
  if (file) appendFileSync(file, `${r.url}\n`);
  return r;
}
