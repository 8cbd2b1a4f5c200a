// YAML text of plain data for the lab, the bench and the tests (configs they
// write for the agent): js-yaml's dump, as the yaml package's stringify did
// it - keys with an undefined value left out, and an object used twice
// written out twice (no &anchors).
import { dump } from 'js-yaml';

export function stringify(value: unknown): string {
  return dump(value, { skipInvalid: true, noRefs: true });
}
