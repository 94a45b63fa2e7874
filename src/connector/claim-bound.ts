/**
 * The scheduler side of "never slower than recomputing". Given the engine's prefill rate
 * (`SchedulerConnectorOptions.computeTokensPerSec`), the scheduler connector:
 *
 * - sends the rate with every lookup, so the sidecar claims a tier's hits only where fetching them
 *   beats computing them (docs/protocol.md 4.1, `computeTokensPerSec`);
 * - gives a lookup at most the time computing the tokens it could claim would take
 *   ({@link lookupWaitMs}): an answer that has not come by then could not beat computing, so the
 *   request computes (the lookup is cancelled);
 * - claims of the answer only what the rule admitted ({@link admittedTokens}): the ready tokens up
 *   to the first tier below host memory that the sidecar did not report as loaded.
 */
import type { LookupAnswer } from '../lookup-client/lookup-client.ts';

/**
 * Milliseconds a lookup may take: the time computing `tokens` takes at `tokensPerSec`, rounded
 * up, at least 1.
 */
export function lookupWaitMs(tokens: number, tokensPerSec: number): number {
  return Math.max(1, Math.ceil((tokens * 1000) / tokensPerSec));
}

/**
 * The tokens of `answer` the rule admits: all of them from a sidecar that reported no rates (it
 * predates the rule, or was not given the rate); otherwise the ready tokens up to the first tier
 * below host memory (the first tier it reports) whose hits it did not report as loaded.
 */
export function admittedTokens(answer: LookupAnswer): number {
  const rates = answer.tierRates;
  if (rates === undefined || rates.length === 0) return answer.hitTokens;
  const host = rates[0]!.tier;
  let pos = 0;
  for (const t of answer.tiers) {
    if (t.tier !== host && rates.find((r) => r.tier === t.tier)?.decision !== 'load') return pos;
    pos += t.tokens;
  }
  return answer.hitTokens;
}
