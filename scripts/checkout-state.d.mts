/** Types of scripts/checkout-state.mjs (plain JavaScript so that `npm test` runs it before tsx). */

/**
 * The entries `git status` lists for the checkout at `dir` (untracked files one by one, ignored
 * ones left out), or null when `dir` is not a git checkout or git is missing.
 */
export declare function checkoutState(dir: string): Set<string> | null;

/**
 * The untracked files of `after` that `before` lacks (files a run created and left), as paths.
 * Changes to tracked files are not counted. Empty when either state is unknown.
 */
export declare function leftBehind(before: Set<string> | null, after: Set<string> | null): string[];
