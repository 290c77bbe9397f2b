// The js blocks of a README's section, for the tests that run a README's examples as a user
// would (each adapter's examples test).
import { readFileSync } from 'node:fs';

/**
 * The ```js blocks between the heading `from` and the heading `to` (or the end).
 * @param {URL} readme
 * @param {string} from  e.g. '## Example'
 * @param {string} [to]
 * @returns {string[]}
 */
export function readmeBlocks(readme, from, to) {
  const text = readFileSync(readme, 'utf8');
  const start = text.indexOf(from);
  if (start < 0) throw new Error(`${readme.pathname} has no "${from}"`);
  const end = to === undefined ? text.length : text.indexOf(to, start);
  if (end < 0) throw new Error(`${readme.pathname} has no "${to}" after "${from}"`);
  return [...text.slice(start, end).matchAll(/^```js\n([\s\S]*?)^```/gm)].map((m) => m[1]);
}
