#!/usr/bin/env bash
# GitLab's half of the update bot: push the changes scripts/ci/update-bot.sh left in
# OUT to the branch update/vllm-<NEW> and open a merge request whose description is
# OUT/report/body.md (nothing to do when OUT/release is absent). Needs the masked
# CI/CD variable VLLM_FORK_BOT_TOKEN: a project access token with the `api` and
# `write_repository` scopes (the job token can neither push nor open merge requests).
set -euo pipefail
out="${1:?usage: scripts/ci/gitlab-merge-request.sh OUT}"
out="$(cd "$out" && pwd)"
cd "${VLLM_FORK_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}"
if [[ ! -f "$out/release" ]]; then
    echo "nothing new: no merge request"
    exit 0
fi
: "${VLLM_FORK_BOT_TOKEN:?set the masked CI/CD variable VLLM_FORK_BOT_TOKEN (docs/ci.md)}"
release="$(cat "$out/release")"
branch="update/vllm-$release"

cp "$out/changes/bases.toml" bases.toml
if [[ -d "$out/changes/series" ]]; then
    # the whole series/ (pool files no series names any more are gone)
    rm -rf series
    cp -R "$out/changes/series" series
fi
git checkout -B "$branch"
git add bases.toml series
if ! git diff --cached --quiet; then  # a job retried in the same checkout committed already
    git -c user.name="vllm-fork update bot" -c user.email="vllm-fork-bot@invalid" \
        commit -q -m "Follow vLLM $release (vllm-fork update)"
fi

# the token goes to git through its environment, never on a command line
auth="$(printf 'oauth2:%s' "$VLLM_FORK_BOT_TOKEN" | base64 -w0)"
GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=http.extraHeader \
    GIT_CONFIG_VALUE_0="Authorization: Basic $auth" \
    git push --force "$CI_SERVER_URL/$CI_PROJECT_PATH.git" "HEAD:refs/heads/$branch"

header="$(mktemp)"
trap 'rm -f "$header"' EXIT
printf 'PRIVATE-TOKEN: %s\n' "$VLLM_FORK_BOT_TOKEN" > "$header"
code="$(curl --silent --show-error --output /dev/null --write-out '%{http_code}' \
    --header @"$header" \
    --data-urlencode "source_branch=$branch" \
    --data-urlencode "target_branch=$CI_DEFAULT_BRANCH" \
    --data-urlencode "title=Follow vLLM $release" \
    --data-urlencode "description@$out/report/body.md" \
    "$CI_API_V4_URL/projects/$CI_PROJECT_ID/merge_requests")"
case "$code" in
    201) echo "opened the merge request for $branch" ;;
    409) echo "the merge request for $branch is open already: its branch was updated" ;;
    *) echo "error: opening the merge request answered HTTP $code" >&2; exit 1 ;;
esac
