#!/usr/bin/env bash
# Writes the generated part of docs/cli.md (between the cli-reference markers): the `--help` of every command and
# subcommand of startline-collector and startline-agent, as the binaries print it. The docs test fails when a
# flag or environment variable of the code is missing from docs/cli.md, so run this after changing a command line.
#
# Environment: STARTLINE_BIN (directory of the two binaries; default target/debug, built here).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${STARTLINE_BIN:-target/debug}
if [ -z "${STARTLINE_BIN:-}" ]; then
  cargo build --locked -p startline-collector -p startline-agent
fi

subcommands() { # HELP TEXT -> subcommand names
  awk '/^Commands:/{on=1; next} on && /^  [a-z]/{print $1; next} on && !/^  /{on=0}' <<<"$1" | grep -vx help || true
}

gen() { # BINARY [SUBCOMMAND...]
  local text
  text=$(COLUMNS=120 "$bin/$1" "${@:2}" --help)
  printf '\n### `%s`\n\n```text\n%s\n```\n' "$*" "$text"
  local sub
  for sub in $(subcommands "$text"); do
    gen "$@" "$sub"
  done
}

out=$(mktemp)
{
  gen startline-collector
  gen startline-agent
} >"$out"
python3 - "$out" <<'PY'
import sys
page = "docs/cli.md"
text = open(page).read()
start, end = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"
a, b = text.index(start) + len(start), text.index(end)
open(page, "w").write(text[:a] + "\n" + open(sys.argv[1]).read().strip("\n") + "\n\n" + text[b:])
PY
rm -f "$out"
echo "docs/cli.md: reference regenerated"
