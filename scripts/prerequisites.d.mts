/** Types of scripts/prerequisites.mjs (plain JavaScript so that `npm test` runs it before tsx). */

/** Packages the tests that use them fail without. */
export declare const REQUIRED_PACKAGES: readonly string[];
/** Packages whose tests are skipped, with the reason, without them. */
export declare const OPTIONAL_PACKAGES: readonly string[];

/** What is not installed, split by {@link REQUIRED_PACKAGES} and {@link OPTIONAL_PACKAGES}. */
export interface MissingPackages {
  required: string[];
  optional: string[];
}

/** What this process may do about it. */
export interface PrerequisiteHost {
  isRoot: boolean;
  hasAptGet: boolean;
}

/** Packages to install now, or the one line to print instead. */
export interface PrerequisitePlan {
  install: string[];
  notice: string | null;
}

export declare function onPath(program: string, path?: string): boolean;
export declare function probeMissing(): MissingPackages;
export declare function planPrerequisites(
  missing: MissingPackages,
  host: PrerequisiteHost,
): PrerequisitePlan;
export declare function noticeFor(missing: MissingPackages, host: PrerequisiteHost): string;
export declare function ensurePrerequisites(opts?: {
  log?: (line: string) => void;
}): MissingPackages;
