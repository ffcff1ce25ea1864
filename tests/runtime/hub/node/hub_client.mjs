// The real @huggingface/hub client against the loopback test hub (tests/runtime/hub/test_hub.py):
//   node hub_client.mjs download HUB_URL ORG/NAME CACHE_DIR   snapshotDownload into CACHE_DIR, prints the snapshot path
//   node hub_client.mjs scan CACHE_DIR                        scanCacheDir, prints what it found as JSON
// Exit code 77 (skipped) when the package is not installed (tools/setup.sh installs it with npm ci).
let hub;
try {
  hub = await import("@huggingface/hub");
} catch (e) {
  console.error(`@huggingface/hub is not installed (run npm ci in ${import.meta.dirname}): ${e.message}`);
  process.exit(77);
}
console.debug = () => {};  // the library logs every file it downloads through console.debug
const [command, ...args] = process.argv.slice(2);
if (command === "download") {
  const [hubUrl, name, cacheDir] = args;
  const path = await hub.snapshotDownload({ repo: { type: "model", name }, hubUrl, cacheDir });
  console.log(path);
} else if (command === "scan") {
  const info = await hub.scanCacheDir(args[0]);
  console.log(JSON.stringify({
    size: info.size,
    warnings: info.warnings.map((w) => String(w.message ?? w)),
    repos: info.repos.map((r) => ({
      id: r.id, path: r.path, size: r.size, filesCount: r.filesCount,
      revisions: r.revisions.map((v) => ({
        commitOid: v.commitOid, refs: v.refs, size: v.size,
        files: v.files.map((f) => ({ path: f.path, blobPath: f.blob.path, size: f.blob.size })),
      })),
    })),
  }));
} else {
  console.error("usage: hub_client.mjs download HUB_URL ORG/NAME CACHE_DIR | scan CACHE_DIR");
  process.exit(2);
}
