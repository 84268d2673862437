#!/usr/bin/env bash
# The update bot's work, run by the scheduled CI jobs (.github/workflows/update.yml,
# .gitlab-ci.yml) and runnable by hand: `vllm-fork update`, then the release check
# of the new base. Writes into OUT:
#   report/update.md, update.json   the rebase review (vllm-fork update's report)
#   report/release-check.md, .json  the new base's release check; report/results/<V>.json
#   report/body.md                  the pull request's body: the review, the check, then
#                                   the upstream watch's untriaged candidates
#   report/watch.md, watch.json     `vllm-fork watch` of every base (upstream vLLM and
#                                   AITER since each base; docs/known-issues.md)
#   changes/                        bases.toml and series/<NEW>/, as the pull request has them
#   release                         the new release (absent when there is none)
# and, under GitHub Actions, `release=<NEW>` to $GITHUB_OUTPUT. Exits 0 when there
# is nothing new or a pull request is to be opened (a failed check is in its body);
# 1 when there is no new release but the watch lists untriaged candidates (the
# daily run fails until they are triaged: report/watch.md lists them); otherwise
# non-zero only when the tool could not run (exit codes of docs/reliability.md).
# The watch clones ROCm/aiter (VLLM_FORK_AITER_REPO, a URL or a directory) and, when
# VLLM_FORK_VLLM_REPO is set, upstream vLLM for the commits after the newest release.
set -euo pipefail
out="${1:?usage: scripts/ci/update-bot.sh OUT}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "${VLLM_FORK_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}"
mkdir -p "$out/report"
rm -f "$out/release"

status=0
vllm-fork update --json "$out/report/update.json" --markdown "$out/report/update.md" || status=$?
if (( status > 1 )); then
    exit "$status"  # an error, not a finding (1: stopped on a conflict or problems found)
fi
release="$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["onto"] or "")' "$out/report/update.json")"

# The upstream watch, every day: what upstream changed in the fork's code since each base.
watch_args=(--aiter-repo "${VLLM_FORK_AITER_REPO:-https://github.com/ROCm/aiter.git}")
if [[ -n "${VLLM_FORK_VLLM_REPO:-}" ]]; then
    watch_args+=(--vllm-repo "$VLLM_FORK_VLLM_REPO")
fi
watch=0
vllm-fork watch "${watch_args[@]}" --json "$out/report/watch.json" \
    > "$out/report/watch.md" || watch=$?
if (( watch > 1 )); then
    cat "$out/report/watch.md"
    exit "$watch"
fi
watch_section() {
    echo; echo "## Upstream watch"; echo
    if (( watch == 0 )); then
        echo "Every candidate is triaged (upstream-triage.toml)."
    else
        echo "Untriaged candidates, or parts not covered: decide each in upstream-triage.toml"
        echo "(docs/known-issues.md, \"Watching upstream\")."
        echo; echo '```'; cat "$out/report/watch.md"; echo '```'
    fi
}

if [[ -z "$release" ]]; then
    echo "no release newer than bases.toml pins"
    if (( watch != 0 )); then
        watch_section
        exit 1
    fi
    exit 0
fi
# the release comes from the index: accept a plain version only
if [[ ! "$release" =~ ^[0-9]+(\.[0-9]+)*$ ]]; then
    echo "error: unexpected release name in the update report: $release" >&2
    exit 1
fi

cp "$out/report/update.md" "$out/report/body.md"
# a series of the release: its series/<V>/series file (docs/series-format.md)
has_series() {
    [[ -f "series/$release/series" ]]
}
if has_series; then
    check=0
    vllm-fork release-check --bases "$release" --out-dir "$out/report/results" \
        --json "$out/report/release-check.json" \
        --markdown "$out/report/release-check.md" || check=$?
    if (( check > 1 )); then
        exit "$check"
    fi
    { echo; echo "## Release check of $release"; echo
      tail -n +3 "$out/report/release-check.md"; } >> "$out/report/body.md"
else
    { echo; echo "## Release check of $release"; echo
      echo "Not run: series/$release is not there yet (the rebase needs a maintainer)."; } \
        >> "$out/report/body.md"
fi

watch_section >> "$out/report/body.md"

mkdir -p "$out/changes"
cp bases.toml "$out/changes/"
if has_series; then
    # the series file and the pool change together: the whole series/ goes
    cp -R series "$out/changes/"
fi
echo "$release" > "$out/release"
if [[ -n "${GITHUB_OUTPUT:-}" ]]; then
    echo "release=$release" >> "$GITHUB_OUTPUT"
fi
echo "pull request body: $out/report/body.md"
