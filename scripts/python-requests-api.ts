/**
 * Where the Python API of a protocol request is not its fields one for one (argument names,
 * defaults and order, fields a hand-written helper shapes from other arguments, the client's
 * deadlines and hooks): what scripts/gen-python-requests.ts reads besides the message table
 * (src/protocol/wire-table.ts). A request without an entry takes its fields in wire order,
 * snake_case, an optional one `= None`; a new message needs no entry here. Entries are typed
 * against the table, so one that names a field its message lacks does not compile.
 */
import type { MESSAGES } from '../src/protocol/wire-table.ts';

type RequestSpec = Extract<(typeof MESSAGES)[number], { dir: 'request' }>;
type RequestName = RequestSpec['name'];
type FieldKeyOf<N extends RequestName> = Extract<RequestSpec, { name: N }>['fields'][number]['key'];

/** One Python parameter as its `def` spells it: `name: type`, or `name: type = default`. */
export type PyParam = string;

/** A call of a hand-written method of the client, with some of the method's parameters. */
export interface PyHook {
  readonly method: string;
  readonly args: readonly string[];
}

/** How one request's Python API differs from what its fields alone give. */
export interface PyRequest<K extends string> {
  /** A field's parameter: its name (default: the key in snake_case), annotation, default. */
  readonly fields?: {
    readonly [k in K]?: {
      readonly name?: string;
      readonly type?: string;
      readonly default?: string;
    };
  };
  /**
   * Fields whose values a helper of python/kvtier_vllm/protocol_args.py computes from `params`
   * (which replace the fields' own, where the first field stood): called with them in order, it
   * returns the value of the one field, or a tuple of the fields' values.
   */
  readonly shaped?: readonly {
    readonly fields: readonly K[];
    readonly params: readonly PyParam[];
    readonly helper: string;
  }[];
  /** The encoder's docstring, after what the table says. */
  readonly doc?: string;
  readonly send?: {
    /** The parameters of `send_<message>` in order, when not the encoder's: a defaulted one left out is sent as its default. */
    readonly order?: readonly string[];
    /** Adds `timeout_ms` (float ms; None: the client's request timeout). */
    readonly timeoutMs?: true;
    /** The deadline, in seconds, a client method computes. */
    readonly timeoutS?: PyHook;
    /** A client method called first. */
    readonly before?: PyHook;
    /** The docstring of `send_<message>`. */
    readonly doc?: string;
  };
  /** The client's method of the message's own name is hand-written (another behaviour): no blocking method is generated. */
  readonly handWrittenSync?: true;
}

/** Parameter names by field key, in every message (`chunkHashes` is `hashes`, as in LOOKUP). */
export const PARAM_NAMES: Readonly<Record<string, string>> = { chunkHashes: 'hashes' };
/** The client's parameter names where they are not the encoder's (there `request_id` is the frame's). */
export const CLIENT_NAMES: Readonly<Record<string, string>> = { engine_request_id: 'request_id' };

/** Where the Python API of a request is not its fields one for one. */
export const PYTHON_REQUESTS: { readonly [N in RequestName]?: PyRequest<FieldKeyOf<N>> } = {
  LOOKUP: {
    shaped: [
      {
        fields: ['config'],
        params: [
          'pin: bool = True',
          'prefetch: bool = True',
          'config: dict | None = None',
          'compute_tokens_per_s: float | None = None',
        ],
        helper: 'lookup_config',
      },
    ],
    doc: `\`\`token_counts\`\`: one per hash (each sent as a u32; the server refuses 0 and counts over its
\`\`maxTokensPerChunk\`\`). The config JSON carries only non-default options (none -> 0 bytes),
unless \`\`config\`\` is given: then that object is sent as compact JSON and \`\`pin\`\`/\`\`prefetch\`\`
are ignored. \`\`compute_tokens_per_s\`\` (the engine's prefill rate, tokens/s, a positive finite
number) adds \`\`computeTokensPerSec\`\` to it: the server then claims a tier's hits only where
fetching them beats computing them, and its answer carries the tier rates.`,
    send: {
      order: [
        'lookup_id',
        'hashes',
        'token_counts',
        'namespaces',
        'pin',
        'prefetch',
        'timeout_ms',
        'compute_tokens_per_s',
      ],
      timeoutMs: true,
      doc: `A LOOKUP as an ordinary request: the result is the whole :class:\`~.protocol_table.LookupResult\`
(status, epoch, tiers; with \`\`compute_tokens_per_s\`\`, \`\`bytes_per_token\`\` and \`\`tier_rates\`\`
too), without the epoch rule or CANCEL on timeout of the client's non-blocking \`\`lookup\`\`.`,
    },
    handWrittenSync: true,
  },
  CANCEL: {
    send: {
      before: { method: '_drop_lookup', args: ['lookup_id'] },
      doc: `CANCEL whose :class:\`~.protocol_table.CancelResult\` (\`\`found\`\`) is wanted. Drops the
lookup's local state like the client's fire-and-forget \`\`cancel\`\`.`,
    },
    handWrittenSync: true,
  },
  CLEAR: {
    fields: { namespaces: { type: 'Iterable[Any]', default: '()' } },
    doc: 'No ``namespaces`` (the default): every namespace.',
  },
  PING: { send: { timeoutMs: true } },
  SAVE: {
    shaped: [
      {
        fields: ['fenceSlot', 'fenceTicket'],
        params: ['fence: tuple[int, int] | None = None'],
        helper: 'split_fence',
      },
    ],
    doc: `\`\`engine_request_id\`\` is the engine's request, a string. \`\`not_after_ns\`\` (the host's
monotonic clock, ns; \`\`time.monotonic_ns()\`\`) adds the optional trailing field: the server copies
nothing past it and discards a copy that finishes after it; None leaves it out. \`\`cuda_event\`\`
(the 64-byte \`\`cudaIpcEventHandle_t\`\` of an interprocess event recorded after the blocks were
written) follows it: the server's copies wait for the event on the GPU (\`\`not_after_ns\`\` is then
written as 0 when None). \`\`fence\`\` = \`\`(slot, ticket)\`\` follows them (zeros before it when
absent): the SAVE stands while slot \`\`slot\`\` of the registered state file holds \`\`ticket\`\`
(only to a server whose PONG lists \`\`saveFence\`\`).`,
    send: {
      doc: `SAVE; \`\`not_after_ns\`\` (\`\`time.monotonic_ns()\`\` scale): the sidecar copies nothing
past it (docs/protocol.md 4.9). The caller must keep the blocks until then, even when the
request fails earlier, unless the SAVE has a \`\`fence\`\` = \`\`(slot, ticket)\`\` of the
registered state file, which it may cancel at any time (:mod:\`kvtier_vllm.save_fence\`;
only to a sidecar whose PONG lists \`\`saveFence\`\`). \`\`cuda_event\`\`: the 64-byte IPC
handle of an interprocess CUDA event recorded after the blocks were written; the
sidecar's copies wait for it.`,
    },
  },
  LOAD: {
    fields: {
      deadlineMs: { default: '0' },
      stateSlot: { default: '-1' },
      skipBlocks: { default: '0' },
    },
    doc: `\`\`deadline_ms\`\`: 0 is the server's default; \`\`state_slot\`\`: -1 for none. \`\`skip_blocks\`\`
> 0 adds the optional trailing field (leading blocks of the first chunk the engine already holds,
absent from \`\`block_ids\`\`); 0 leaves it out, so servers without it accept the frame.
\`\`not_after_ns\`\` (as for :func:\`encode_save\`: no chunk starts past it) follows
\`\`skip_blocks\`\`, which is then written too, 0 included. \`\`progress_slot\`\` follows them: a
layer-wise load that writes the leading layers in place to that slot of the registered state
file (only to a server whose PONG lists \`\`layerwiseLoad\`\`).`,
    send: {
      timeoutS: { method: '_load_timeout_s', args: ['deadline_ms'] },
      doc: `LOAD; \`\`not_after_ns\`\` as for :meth:\`send_save\`: no chunk starts past it. The answer is
awaited until a little after the LOAD's own deadline (\`\`deadline_ms\`\`, or the server's).`,
    },
  },
};
