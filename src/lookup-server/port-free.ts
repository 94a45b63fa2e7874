/**
 * The wait the lookup server's `close` ends with: ZMQ closes a TCP listener on its own I/O
 * thread, so a server restarted on the same endpoint would race it.
 */
import { createServer } from 'node:net';

/** Polls until a TCP listener can bind the endpoint's address (at most ~2 s); never throws. */
export async function waitForPortFree(endpoint: string): Promise<void> {
  const m = /^tcp:\/\/(.+):(\d+)$/.exec(endpoint);
  if (m === null) return;
  const host = m[1]!.replace(/^\[|\]$/g, '');
  const port = Number(m[2]);
  for (let attempt = 0; attempt < 200; attempt++) {
    const free = await new Promise<boolean>((resolve) => {
      const probe = createServer();
      probe.once('error', () => resolve(false));
      probe.listen({ port, host, exclusive: true }, () => probe.close(() => resolve(true)));
    });
    if (free) return;
    await new Promise((r) => setTimeout(r, 10));
  }
}
