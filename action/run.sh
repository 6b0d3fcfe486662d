#!/usr/bin/env bash
# The audit step of the GitHub Action (action.yml). Its inputs arrive as environment variables, never pasted into
# the script's text by the workflow, so a model name or an option is only ever data: nothing in them runs as shell.
#
#   PRECAUDIT_MODELS        one path or glob per line (a path may hold spaces); `**` crosses folders
#   PRECAUDIT_DTYPE         --dtype (default fp16)
#   PRECAUDIT_ARGS          more options for `precaudit check`, split as a shell would split them (quotes work;
#                           nothing is expanded or run)
#   PRECAUDIT_SARIF         write a SARIF report to this file too (default: none, or precaudit.sarif in
#                           RUNNER_TEMP when PRECAUDIT_UPLOAD_SARIF is true)
#   PRECAUDIT_UPLOAD_SARIF  true: the next step uploads the SARIF file
#   PRECAUDIT_FACTORIES     true: a literal line of PRECAUDIT_MODELS may be a PyTorch factory (model.py:make), whose
#                           code runs; otherwise precaudit runs with --no-factories and imports no code at all
#
# The models, the config and the Python files in the checkout come from the pull request. A glob's match is always
# a path, never a factory spec or an option (precaudit reads an existing path as a file, and the paths follow --);
# the checkout's own .py files never shadow a module precaudit imports (see `launcher`).
#
# The step ends with precaudit's exit code (0 clean, 1 findings at --fail-on, 2 an error), and writes exit-code and
# sarif-file to GITHUB_OUTPUT when it is set.
set -uo pipefail

# One ::error annotation from the script itself: its text escaped as GitHub's toolkit escapes a command's data (% and
# line breaks), and `##[`, the runner's older command syntax, written with \x5b as precaudit writes it.
error_line() {
  local text=${1//'%'/%25}
  text=${text//$'\r'/%0D}
  text=${text//$'\n'/%0A}
  printf '::error title=precaudit::%s\n' "${text//'##['/'##\x5b'}"
}

# The outputs, written once, then the exit: exit-code always, sarif-file only for a file this run wrote. No value
# holds a line break (a sarif input with one is refused), so a NAME=VALUE line cannot forge another output.
finish() {
  if [ -n "${GITHUB_OUTPUT:-}" ]; then
    {
      echo "exit-code=$1"
      if [ -n "${2:-}" ]; then printf 'sarif-file=%s\n' "$2"; fi
    } >> "$GITHUB_OUTPUT"
  fi
  exit "$1"
}

dtype="${PRECAUDIT_DTYPE:-fp16}"
factories="${PRECAUDIT_FACTORIES:-false}"
sarif="${PRECAUDIT_SARIF:-}"
if [ -z "$sarif" ] && [ "${PRECAUDIT_UPLOAD_SARIF:-false}" = "true" ]; then
  sarif="${RUNNER_TEMP:-.}/precaudit.sarif"
fi
case "$sarif" in
  *$'\n'* | *$'\r'*) error_line "the sarif input holds a line break: give one file path"; finish 2 ;;
esac

# The models: each line is a path, or a glob when no file has that name and it holds * ? or [. The glob is expanded
# by bash itself, with IFS empty so the line is never split; an expansion's result is never expanded again, so
# `$(...)` in a file name stays text. A glob that matches nothing is an error (the step fails rather than passing
# on no model); a line that is no glob and no file is passed as written: a missing file, or a factory spec.
code=0
shopt -s globstar nullglob
models=()
while IFS= read -r line || [ -n "$line" ]; do
  line="${line#"${line%%[![:space:]]*}"}"
  line="${line%"${line##*[![:space:]]}"}"
  [ -n "$line" ] || continue
  if [ -e "$line" ] || [ -L "$line" ] || [[ "$line" != *[*?[]* ]]; then
    models+=("$line")
    continue
  fi
  IFS=
  matches=($line)
  IFS=$' \t\n'
  if [ "${#matches[@]}" -eq 0 ]; then
    error_line "models: no file matches $line"
    code=2
  else
    models+=("${matches[@]}")
  fi
done <<< "${PRECAUDIT_MODELS:-}"
shopt -u globstar nullglob
if [ "${#models[@]}" -eq 0 ]; then
  [ "$code" -ne 0 ] || error_line "the models input names no model"
  finish 2
fi

# The extra options, split by Python's shlex (quotes as in a shell, no expansion), one NUL-ended word each. -I keeps
# the working folder off sys.path: the checkout's own shlex.py is not the one imported.
extra=()
if [ -n "${PRECAUDIT_ARGS:-}" ]; then
  words="$(mktemp)"
  if ! problem="$(python -I -c '
import shlex, sys
try:
    words = shlex.split(sys.argv[1])
except ValueError as exc:
    sys.exit(str(exc))
sys.stdout.write("".join(w + "\0" for w in words))' "$PRECAUDIT_ARGS" 2>&1 > "$words")"; then
    rm -f "$words"
    error_line "the args input does not split into words as a shell splits them: $problem"
    finish 2
  fi
  mapfile -d '' -t extra < "$words"
  rm -f "$words"
fi

# `python -m precaudit` would put the working folder, the pull request's checkout, first on sys.path, and its
# typer.py or onnx.py would be imported in place of the real one. The launcher takes the folder off; with factories
# it puts it back last, where package.module:make finds the checkout's packages and shadows nothing installed.
launcher='import os, sys
here = os.getcwd()
sys.path[:] = [p for p in sys.path if p not in ("", ".", here)]
if os.environ.get("PRECAUDIT_FACTORIES") == "true":
    sys.path.append(here)
from precaudit.cli import main
main()'
check=(python -c "$launcher" check "--dtype=$dtype")
if [ "$factories" != "true" ]; then
  check+=(--no-factories)  # before args, so no option in args can take it as its value
fi
check+=("${extra[@]}")

# One run writes one report format, so SARIF is a second run of the same audit; its exit code is the same unless
# writing the file fails, and the worse is the step's. Both runs say each bad model on stderr: it is said once,
# with what only the SARIF run said (that it could not write its file). sarif-file names the file only when this
# run wrote it: precaudit renames a new file into place (a new inode), and refuses a model or any file it reads.
errors="$(mktemp -d)"
written=""
if [ -n "$sarif" ]; then
  before="$(ls -di -- "$sarif" 2>/dev/null)"
  "${check[@]}" --format=sarif "--output=$sarif" -- "${models[@]}" 2> "$errors/sarif"
  ran=$?
  [ "$ran" -le "$code" ] || code=$ran
  after="$(ls -di -- "$sarif" 2>/dev/null)"
  if [ -n "$after" ] && [ "$after" != "$before" ] && [ -f "$sarif" ] && [ ! -L "$sarif" ]; then
    written="$sarif"
  fi
fi
"${check[@]}" --format=github -- "${models[@]}" 2> "$errors/github"
ran=$?
[ "$ran" -le "$code" ] || code=$ran
cat "$errors/github" >&2
if [ -f "$errors/sarif" ]; then
  grep -vxF -f "$errors/github" "$errors/sarif" >&2
fi
rm -rf "$errors"
finish "$code" "$written"
