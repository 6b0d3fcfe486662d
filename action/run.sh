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
#
# The step ends with precaudit's exit code (0 clean, 1 findings at --fail-on, 2 an error), and writes exit-code and
# sarif-file to GITHUB_OUTPUT when it is set.
set -uo pipefail

dtype="${PRECAUDIT_DTYPE:-fp16}"
sarif="${PRECAUDIT_SARIF:-}"
if [ -z "$sarif" ] && [ "${PRECAUDIT_UPLOAD_SARIF:-false}" = "true" ]; then
  sarif="${RUNNER_TEMP:-.}/precaudit.sarif"
fi

# The models: each line is a path, or a glob when no file has that name. The glob is expanded by bash itself, with
# IFS empty so the line is never split; an expansion's result is never expanded again, so `$(...)` in a file name
# stays text. A glob that matches nothing is passed as written: precaudit then says no such file (exit 2) rather
# than the audit passing on no model.
shopt -s globstar nullglob
models=()
while IFS= read -r line || [ -n "$line" ]; do
  line="${line#"${line%%[![:space:]]*}"}"
  line="${line%"${line##*[![:space:]]}"}"
  [ -n "$line" ] || continue
  if [ -e "$line" ]; then
    models+=("$line")
    continue
  fi
  IFS=
  matches=($line)
  IFS=$' \t\n'
  if [ "${#matches[@]}" -eq 0 ]; then
    models+=("$line")
  else
    models+=("${matches[@]}")
  fi
done <<< "${PRECAUDIT_MODELS:-}"
shopt -u globstar nullglob

# The extra options, split by Python's shlex (quotes as in a shell, no expansion), one NUL-ended word each.
extra=()
if [ -n "${PRECAUDIT_ARGS:-}" ]; then
  words="$(mktemp)"
  if ! python -c 'import shlex, sys; sys.stdout.write("".join(w + "\0" for w in shlex.split(sys.argv[1])))' \
      "$PRECAUDIT_ARGS" > "$words"; then
    echo "::error title=precaudit::the args input does not split into options (an unclosed quote?)"
    rm -f "$words"
    exit 2
  fi
  mapfile -d '' -t extra < "$words"
  rm -f "$words"
fi

check=(python -m precaudit check --dtype "$dtype" "${extra[@]}")
# One run writes one report format, so SARIF is a second run of the same audit; its exit code is the same unless
# writing the file fails, and the worse of the two is the step's.
code=0
if [ -n "$sarif" ]; then
  "${check[@]}" --format sarif --output "$sarif" -- "${models[@]}"
  code=$?
fi
"${check[@]}" --format github -- "${models[@]}"
annotations=$?
if [ "$annotations" -gt "$code" ]; then
  code=$annotations
fi

if [ -n "${GITHUB_OUTPUT:-}" ]; then
  {
    echo "exit-code=$code"
    if [ -n "$sarif" ] && [ -f "$sarif" ]; then echo "sarif-file=$sarif"; fi
  } >> "$GITHUB_OUTPUT"
fi
exit "$code"
