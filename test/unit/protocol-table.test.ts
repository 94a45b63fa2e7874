/**
 * The protocol message table (src/protocol/wire-table.ts) and what is generated from it:
 * the Python package's table (python/kvtier_vllm/protocol_table.py) and the layout blocks of
 * docs/protocol.md must be what scripts/gen-protocol.ts writes now, byte for byte.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { DOC_PATH, PY_TABLE_PATH, pythonTable, regenerateDoc } from '../../scripts/gen-protocol.ts';
import { request } from '../../src/protocol/wire-spec.ts';
import { MESSAGES } from '../../src/protocol/wire-table.ts';

const ROOT = new URL('../..', import.meta.url).pathname;
const STALE = 'stale: regenerate with npm run gen:protocol';

describe('protocol message table', () => {
  it('has one entry per type code and per message type, replies paired with requests', () => {
    const codes = MESSAGES.map((m) => m.code);
    assert.equal(new Set(codes).size, codes.length);
    assert.equal(new Set(MESSAGES.map((m) => m.tag)).size, MESSAGES.length);
    for (const m of MESSAGES) {
      assert.equal(m.code >= 0x80, m.dir === 'reply', `${m.name} direction`);
      if (m.dir === 'request')
        assert.ok(
          MESSAGES.some((r) => r.code === (m.code | 0x80)),
          `${m.name} has a reply with code 0x${(m.code | 0x80).toString(16)}`,
        );
    }
  });

  it('puts optional fields only at the end of a message', () => {
    for (const m of MESSAGES) {
      const optional = m.fields.map((f) => 'optional' in f && f.optional === true);
      const first = optional.indexOf(true);
      if (first >= 0) assert.ok(optional.slice(first).every(Boolean), `${m.name}`);
    }
  });

  it(`${PY_TABLE_PATH} is current`, () => {
    assert.equal(readFileSync(join(ROOT, PY_TABLE_PATH), 'utf8'), pythonTable(), STALE);
  });

  it(`${DOC_PATH} shows every message's layout as the table has it`, () => {
    const doc = readFileSync(join(ROOT, DOC_PATH), 'utf8');
    assert.equal(regenerateDoc(doc), doc, STALE);
  });

  it('adds the layout block of a message the document lacks at the end of its section', () => {
    const doc = readFileSync(join(ROOT, DOC_PATH), 'utf8');
    const hold = /<!-- wire-layout: HOLD -->[\s\S]*?<!-- \/wire-layout -->/;
    const block = hold.exec(doc)![0];
    const out = regenerateDoc(doc.replace(hold, ''));
    assert.equal(out.match(/<!-- wire-layout: HOLD -->/g)?.length, 1);
    // Section 4.9 ends where section 5 begins: the block is its last part.
    assert.ok(out.includes(`${block}\n\n## 5. Errors`), 'at the end of section 4.9');
    assert.equal(regenerateDoc(out), out, 'and kept where it is from then on');
  });

  it('refuses a message whose section the document lacks, and a block of an unknown message', () => {
    const doc = readFileSync(join(ROOT, DOC_PATH), 'utf8');
    const table = [...MESSAGES, request('EXAMPLE_ECHO', 0x7f, '4.99', [])];
    assert.throws(() => regenerateDoc(doc, table), /has no section 4\.99 for EXAMPLE_ECHO/);
    const extra = `${doc}\n<!-- wire-layout: EXAMPLE_ECHO --><!-- /wire-layout -->\n`;
    assert.throws(() => regenerateDoc(extra), /layout block for unknown message EXAMPLE_ECHO/);
  });
});
