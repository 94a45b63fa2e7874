/**
 * Where a JSON text first goes wrong, as a line and column: Node 20's `JSON.parse` names a
 * character position for some errors and none for others, and a config file's reader needs the
 * line. A small scanner of RFC 8259 syntax, used only after `JSON.parse` has failed.
 */

/** 0-based offset of the first character that makes `text` invalid JSON (its length at a premature end), or -1 if it is valid. */
export function jsonErrorOffset(text: string): number {
  let i = 0;
  const n = text.length;
  const ws = () => {
    while (i < n && (text[i] === ' ' || text[i] === '\t' || text[i] === '\n' || text[i] === '\r'))
      i++;
  };
  // Each scanner returns false at the offending character (i left there).
  const literal = (word: string): boolean => {
    for (const c of word) {
      if (text[i] !== c) return false;
      i++;
    }
    return true;
  };
  const string = (): boolean => {
    i++; // opening quote
    while (i < n) {
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        i++;
        return true;
      }
      if (c < 0x20) return false;
      if (c === 0x5c) {
        i++;
        const e = text[i];
        if (e === 'u') {
          for (let k = 1; k <= 4; k++) {
            if (!/[0-9a-fA-F]/.test(text[i + k] ?? '')) {
              i += k;
              return false;
            }
          }
          i += 5;
        } else if (e !== undefined && '"\\/bfnrt'.includes(e)) i++;
        else return false;
      } else i++;
    }
    return false;
  };
  const number = (): boolean => {
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    if (m === null || m[0] === '' || m[0] === '-') {
      if (text[i] === '-') i++;
      return false;
    }
    i += m[0].length;
    return true;
  };
  const value = (depth: number): boolean => {
    ws();
    const c = text[i];
    if (c === '{' || c === '[') {
      if (depth > 512) return false;
      const close = c === '{' ? '}' : ']';
      i++;
      ws();
      if (text[i] === close) {
        i++;
        return true;
      }
      for (;;) {
        if (c === '{') {
          ws();
          if (text[i] !== '"' || !string()) return false;
          ws();
          if (text[i] !== ':') return false;
          i++;
        }
        if (!value(depth + 1)) return false;
        ws();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] !== close) return false;
        i++;
        return true;
      }
    }
    if (c === '"') return string();
    if (c === 't') return literal('true');
    if (c === 'f') return literal('false');
    if (c === 'n') return literal('null');
    return number();
  };
  if (!value(0)) return Math.min(i, n);
  ws();
  return i < n ? i : -1;
}

/** 1-based line and column of `offset` in `text` (columns count UTF-16 units). */
export function lineColumn(text: string, offset: number): { line: number; column: number } {
  const before = text.slice(0, offset);
  const line = before.split('\n').length;
  return { line, column: offset - before.lastIndexOf('\n') };
}
