import type { NodeTiming } from './engine-node.ts';
import { decodeStepSeconds, type EngineSpeed, stepSeconds } from './gpu.ts';
import { kvBytesPerToken, type PlannedModel } from './models.ts';
import { loadDurationSeconds, type PlannerTier, type TierModel } from './tier-models.ts';

/**
 * The planner's {@link NodeTiming}: steps from the GPU model (`gpu.ts`), loads from the tier
 * models (`tier-models.ts`), in the planned model's bytes. Sidecar tiers are named after the
 * planner tier they stand for (`cpu`, `disk`, `fs`, `redis`, `s3`); a tier of another name is
 * charged as the slowest tier.
 */
export function plannerTiming(
  planned: PlannedModel,
  speed: EngineSpeed,
  tiers: Record<PlannerTier, TierModel>,
): NodeTiming {
  const bpt = kvBytesPerToken(planned);
  const slowest = (Object.keys(tiers) as PlannerTier[]).reduce((a, b) =>
    tiers[a].readBytesPerSec <= tiers[b].readBytesPerSec ? a : b,
  );
  return {
    stepMs: (segments) => 1000 * stepSeconds(planned, speed, segments),
    decodeStepMs: (batch, context) => 1000 * decodeStepSeconds(planned, speed, batch, context),
    loadMs: (tokensByTier) => {
      const bytes: Partial<Record<PlannerTier, number>> = {};
      for (const [name, n] of Object.entries(tokensByTier)) {
        const t = (name in tiers ? name : slowest) as PlannerTier;
        bytes[t] = (bytes[t] ?? 0) + n * bpt;
      }
      return 1000 * loadDurationSeconds(bytes, tiers);
    },
    tierRate: (name) => {
      const m = tiers[(name in tiers ? name : slowest) as PlannerTier];
      return { secondsPerToken: bpt / m.readBytesPerSec, latencySeconds: m.floorSeconds };
    },
  };
}
