/**
 * Options of a plug-in tier (type "module"), declared once ({@link MODULE_OPTIONS}): which module
 * to load, and the settings its factory gets unchanged.
 */
import * as v from 'valibot';
import { str } from '../../util/schema-kit.ts';
import { describe } from '../../util/validate.ts';
import { defineTierOptions, optional, required } from '../core/tier-options.ts';

const pluginOptionsMsg = (i: v.BaseIssue<unknown>) =>
  `must be an object of plug-in settings, got ${describe(i.input)}`;

/** A plug-in tier's options: names, types and descriptions. */
export const MODULE_OPTIONS = defineTierOptions({
  type: 'module',
  description:
    'A plug-in backend: "module" is a package name or a path (relative to the config file); "options" go to its createBackend unchanged.',
  options: {
    module: required(
      str({ nonEmpty: true }),
      'The plug-in: a package name, or a path (relative to the config file).',
    ),
    options: optional(
      v.pipe(
        v.unknown(),
        v.check((x) => !Array.isArray(x), pluginOptionsMsg),
        v.record(v.string(), v.unknown(), pluginOptionsMsg),
      ),
      "Settings passed to the plug-in's createBackend unchanged.",
    ),
  },
  unknownKeyHint: 'put plug-in settings under "options"',
  example: { module: './my-tier.js' },
});
