/**
 * Worker connector additions: a load intent's skipBlocks reaches the data-plane client, and
 * close() unregisters the engine (best effort, bounded) before closing the client.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { ConnectorMeta } from '../../src/connector/types.ts';
import {
  KvtierWorkerConnector,
  type WorkerDataPlaneClient,
} from '../../src/connector/worker-connector.ts';

type LoadArgs = Parameters<WorkerDataPlaneClient['load']>[0];

/** Records what the connector sends; every call answers at once unless told otherwise. */
class RecordingClient implements WorkerDataPlaneClient {
  readonly loads: LoadArgs[] = [];
  readonly calls: string[] = [];
  unregisterBehaviour: 'ok' | 'fail' | 'hang' | 'hang-ignoring-signal' = 'ok';
  unregister?: WorkerDataPlaneClient['unregister'] = (opts) => {
    this.calls.push('unregister');
    if (this.unregisterBehaviour === 'ok') return Promise.resolve(true);
    if (this.unregisterBehaviour === 'fail') return Promise.reject(new Error('sidecar gone'));
    return new Promise<boolean>((_, reject) => {
      if (this.unregisterBehaviour === 'hang')
        opts?.signal?.addEventListener('abort', () => reject(new Error('aborted')));
    });
  };

  async register() {
    return { engineId: 'e', namespace: '0'.repeat(32), chunkSize: 16, blockSize: 4 };
  }
  async save() {
    return { saved: 0, skipped: 0, dropped: 0 };
  }
  async load(a: LoadArgs) {
    this.loads.push(a);
    return { loadedTokens: 0, invalidBlockIds: [] };
  }
  async requestFinished() {
    return true;
  }
  async close() {
    this.calls.push('close');
  }
}

function meta(loads: ConnectorMeta['loads']): ConnectorMeta {
  return { loads, saves: [], finished: [] };
}

describe('worker connector: partial-chunk loads', () => {
  it('passes skipBlocks through, and sends none for a whole-chunk load', async () => {
    const client = new RecordingClient();
    const w = new KvtierWorkerConnector({ client });
    await w.registerKvCaches({} as never);
    const intent = {
      requestId: 'a',
      lookupId: 'a#1',
      firstChunk: 2,
      numTokens: 16 - 3 * 4 + 16,
      blockIds: [7, 8, 9, 10, 11],
      chunkHashes: Buffer.alloc(64),
    };
    w.startLoadKv(
      meta([
        { ...intent, skipBlocks: 3 },
        { ...intent, requestId: 'b' },
      ]),
    );
    w.startLoadKv(meta([{ ...intent, requestId: 'c', skipBlocks: 0 }]));
    await w.whenIdle();
    assert.equal(client.loads[0]!.skipBlocks, 3);
    assert.deepEqual(client.loads[0]!.blockIds, [7, 8, 9, 10, 11]);
    assert.equal('skipBlocks' in client.loads[1]!, false);
    assert.equal('skipBlocks' in client.loads[2]!, false);
  });
});

describe('worker connector: close unregisters', () => {
  async function registered(client: RecordingClient, unregisterTimeoutMs?: number) {
    const w = new KvtierWorkerConnector({
      client,
      ...(unregisterTimeoutMs === undefined ? {} : { unregisterTimeoutMs }),
    });
    await w.registerKvCaches({} as never);
    return w;
  }

  it('unregisters then closes the client, once', async () => {
    const client = new RecordingClient();
    const w = await registered(client);
    await w.close();
    await w.close();
    assert.deepEqual(client.calls, ['unregister', 'close']);
  });

  it('a failed unregister does not fail close', async () => {
    const client = new RecordingClient();
    client.unregisterBehaviour = 'fail';
    const w = await registered(client);
    await w.close();
    assert.deepEqual(client.calls, ['unregister', 'close']);
  });

  for (const behaviour of ['hang', 'hang-ignoring-signal'] as const)
    it(`an unanswered unregister is given up after unregisterTimeoutMs (${behaviour})`, async () => {
      const client = new RecordingClient();
      client.unregisterBehaviour = behaviour;
      const w = await registered(client, 20);
      await w.close();
      assert.deepEqual(client.calls, ['unregister', 'close']);
    });

  it('sends nothing before registration or with a client that has no unregister', async () => {
    const unregistered = new RecordingClient();
    await new KvtierWorkerConnector({ client: unregistered }).close();
    assert.deepEqual(unregistered.calls, ['close']);
    const plain = new RecordingClient();
    plain.unregister = undefined;
    const w = await registered(plain);
    await w.close();
    assert.deepEqual(plain.calls, ['close']);
  });

  it('refuses a bad unregisterTimeoutMs', () => {
    assert.throws(
      () => new KvtierWorkerConnector({ client: new RecordingClient(), unregisterTimeoutMs: 0 }),
      { code: 'KVT_INVALID_ARGUMENT' },
    );
  });
});
