// Shared by the npm client tests: the installed version of a package, and named checks that time themselves and
// stop the test (by throwing) at the first failure.
import { readFileSync } from "node:fs";

export function packageVersion(name) {
  return JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;
}

export function checker() {
  let passed = 0;
  return {
    async check(name, fn) {
      const t0 = performance.now();
      await fn();
      passed++;
      console.log(`ok   ${name} (${(performance.now() - t0).toFixed(0)} ms)`);
    },
    passed: () => passed,
  };
}
