"""The fork's changes: the one place that says what each change is.

Every other part of the tool (the probes' dispatch, ``status``, ``matrix``,
``smoke``, the provenance record, the patch-header check, the README and
docs/changes.md tables) reads this module. Adding a change means adding an
entry here, a probe, and patches carrying ``Fork-Change: <id>``.

A maintainer's own change needs no Python: ``local-changes.toml`` at the
repository root declares it (``vllm-fork change add ID --title TEXT`` writes
the entry). A local change has no probe: it is carried where a
``Fork-Part: change`` patch of it is, and every command shows it like the
others (docs/changes.md).

Releases are upstream vLLM versions; "since" and "until" bounds are inclusive.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w
from packaging.version import Version

from vllm_fork.atomic import write_bytes_atomic
from vllm_fork.config import find_root
from vllm_fork.diffs import is_test_module
from vllm_fork.errors import ConfigError, UsageError
from vllm_fork.facts.finding import UNPROBED

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    pass

PR_URL = "https://github.com/vllm-project/vllm/pull/"
# Patch headers write an upstream commit as ``commit:<sha>`` (DEP-3's commit notation).
COMMIT_PREFIX = "commit:"


@dataclass(frozen=True)
class Hardening:
    """A hardening item: what the fork adds that upstream's version lacks."""

    id: str
    description: str  # one line
    # last release the item applies to (None: every one), and why not after it
    until: str | None = None
    until_why: str = ""

    def applies_at(self, version: str) -> bool:
        return self.until is None or Version(version) <= Version(self.until)


@dataclass(frozen=True)
class Landing:
    """A file a change lands in, for the releases where it lives at that path."""

    path: str
    since: str | None = None  # first release with the file here (None: every one)
    until: str | None = None  # last release with the file here (None: still there)
    added: bool = False  # the fork adds the file; upstream has none

    def at(self, version: str) -> bool:
        v = Version(version)
        if self.since is not None and v < Version(self.since):
            return False
        return self.until is None or v <= Version(self.until)


@dataclass(frozen=True)
class Change:
    id: str
    title: str
    pr: int | None  # the upstream PR the change implements (None: a vendor change, no PR)
    upstream_since: str | None  # first upstream release that has it (None: none yet)
    applies_since: str | None  # first release with the code it modifies (None: every one)
    files: tuple[Landing, ...]
    hardening: tuple[Hardening, ...]
    probe: str  # "module:function", called with a SourceTree, returns a Finding
    tests: tuple[str, ...]  # the fork's test modules that prove it (paths in the vLLM tree)
    why: str  # one line: why the fork carries it
    retire_when: str  # one line: when the fork stops carrying it
    # The PR's squash-merge commit on upstream's main: 40 hex digits, or the
    # unique prefix that could be found (None: not found yet).
    upstream_commit: str | None = None
    # Who wrote the PR, as DEP-3 ``Author`` values ("Name <email>"; where no
    # email could be found, "login <https://github.com/login>"): the commit's
    # author, then each Co-authored-by. Every backport patch credits them.
    upstream_authors: tuple[str, ...] = ()
    local: bool = False  # declared in local-changes.toml: no probe, no upstream PR

    @property
    def pr_url(self) -> str | None:
        return f"{PR_URL}{self.pr}" if self.pr is not None else None

    @property
    def backport_origin(self) -> str | None:
        """The ``Origin`` value of a patch that backports this change's PR:
        ``backport, <PR url>[, commit:<sha>]`` (None: a vendor change)."""
        if self.pr_url is None:
            return None
        commit = f", {COMMIT_PREFIX}{self.upstream_commit}" if self.upstream_commit else ""
        return f"backport, {self.pr_url}{commit}"

    @property
    def hardening_ids(self) -> tuple[str, ...]:
        return tuple(h.id for h in self.hardening)

    def hardening_at(self, version: str) -> tuple[str, ...]:
        """The ids of the hardening items that apply to ``version``."""
        return tuple(h.id for h in self.hardening if h.applies_at(version))

    def scoped_hardening(self, version: str, found: dict[str, bool]) -> dict[str, bool]:
        """``found`` (a probe's hardening) less the items that do not apply to ``version``."""
        keep = set(self.hardening_at(version))
        return {k: v for k, v in found.items() if k in keep}

    def files_at(self, version: str) -> tuple[str, ...]:
        """The paths the change lands in at ``version``."""
        return tuple(f.path for f in self.files if f.at(version))

    def expected_upstream(self, version: str) -> str:
        """What the probe of a pristine ``version`` is declared to find:
        "present", "absent" or "n/a" ("unprobed": a local change, which has no probe)."""
        if self.local:
            return UNPROBED
        v = Version(version)
        if self.applies_since is not None and v < Version(self.applies_since):
            return "n/a"
        if self.upstream_since is not None and v >= Version(self.upstream_since):
            return "present"
        return "absent"


@dataclass(frozen=True)
class Support:
    """A ``Fork-Change`` id for shared infrastructure: no probe, never a state."""

    id: str
    title: str
    files: tuple[str, ...]


_ROPE_KERNEL = "pos_encoding_kernels.cu"
# where the rotary kernel lives, per release range
_ROPE_KERNEL_FILES = (
    Landing(f"csrc/{_ROPE_KERNEL}", until="0.21.0"),
    Landing(f"csrc/libtorch_stable/{_ROPE_KERNEL}", since="0.22.0", until="0.31.0"),
    Landing(f"csrc/{_ROPE_KERNEL}", since="0.32.0"),
)

CHANGES: tuple[Change, ...] = (
    Change(
        id="rope-cache-dtype",
        title="The rotary kernel reads the cos/sin cache in its own dtype",
        pr=41113,
        upstream_since="0.21.0",
        applies_since="0.20.0",
        files=(*_ROPE_KERNEL_FILES, Landing("vllm/_custom_ops.py")),
        hardening=(
            Hardening(
                "python-dtype-check",
                "ops.rotary_embedding passes exactly the query/cache dtype pairs the kernel "
                "dispatches and rejects a cache of another dtype, device or shape before the op "
                "runs",
            ),
            Hardening(
                "bounded-dispatch",
                "the kernel is instantiated only for cache dtype = query dtype or float32",
                until="0.20.2",
                until_why="from 0.21.0 upstream's kernel takes every query/cache dtype pair, "
                "and the fork keeps that dispatch for out-of-tree callers: "
                "python-dtype-check follows it",
            ),
            Hardening(
                "empty-batch",
                "ops.rotary_embedding returns without calling the op on an empty batch "
                "(upstream's kernel dies with SIGFPE)",
            ),
        ),
        probe="vllm_fork.probes.rope:probe_rope_cache_dtype",
        tests=(
            "tests/kernels/core/test_rotary_embedding_cache_dtype.py",
            "tests/kernels/core/test_rotary_embedding_cache_check.py",
            "tests/kernels/core/test_rotary_embedding_empty_batch.py",
        ),
        why="0.20.0 copies the whole cos/sin cache to float32 on every call "
        "(+64 MiB, ~57 us at 256 tokens for a 131072 x 128 bf16 cache)",
        retire_when="the change once the oldest supported base is 0.21.0; the hardening "
        "once upstream checks the cache before the op, bounds the dispatch and survives an "
        "empty batch",
        # author: v0.21.0 release notes (@jeejeelee), email from his sign-offs of that
        # time; the merge commit was not found
        upstream_authors=("Jee Jee Li <pandaleefree@gmail.com>",),
    ),
    Change(
        id="rope-fast-kernel",
        title="A vectorized rotary kernel, bit-identical to upstream's",
        pr=None,
        upstream_since=None,
        applies_since="0.20.0",
        files=_ROPE_KERNEL_FILES,
        hardening=(),
        probe="vllm_fork.probes.rope_kernel:probe_rope_fast_kernel",
        tests=(
            "tests/kernels/core/test_rotary_embedding_fast.py",
            "tests/kernels/core/test_rotary_embedding_rocm_portable.py",
            "tests/kernels/core/test_rotary_embedding_op_check.py",
        ),
        why="1.2-2.3x faster than upstream's kernel at every size, and FlashInfer's "
        "faster kernel does not run on ROCm",
        retire_when="upstream's rotary kernel is as fast",
    ),
    Change(
        id="rope-bf16-buffer",
        title="A bf16 copy of a non-bf16 rotary cache for AITER under torch.compile",
        pr=42833,
        upstream_since="0.23.0",
        applies_since=None,
        files=(Landing("vllm/model_executor/layers/rotary_embedding/base.py"),),
        hardening=(
            Hardening(
                "buffer-dtype-check",
                "the bf16 copy is returned only while its dtype matches "
                "(not after module.to(torch.float16))",
            ),
            Hardening(
                "no-unusable-buffer",
                "no copy where it cannot be used (complex caches, non-AITER paths, bf16 caches)",
            ),
            Hardening("recompute-consistent", "the copy follows a cache a subclass recomputes"),
            Hardening(
                "refresh-in-place",
                "the copy keeps its storage when the cache is refreshed and takes the new "
                "values in place (captured graphs read it)",
            ),
        ),
        probe="vllm_fork.probes.rope:probe_rope_bf16_buffer",
        tests=(
            "tests/rocm/aiter/test_rope_bf16_cache.py",
            "tests/rocm/aiter/test_rope_bf16_cache_hardening.py",
            "tests/rocm/aiter/test_rope_bf16_cache_reload.py",
            "tests/rocm/aiter/test_rope_bf16_cache_in_place.py",
        ),
        why="a float32 cache (GPT-OSS) is cast once per rotary layer in every AITER decode graph",
        retire_when="the change once the oldest supported base is 0.23.0; the hardening "
        "once upstream checks the copy's dtype, creates it only where it is used and "
        "refreshes it in place",
        # commit and author: the commit's message (Signed-off-by), no co-authors
        upstream_commit="de12f5ca0b8bcec55b6fa29174900360ef31cc0e",
        upstream_authors=("Aakif Nawaz <aakif.nawaz@amd.com>",),
    ),
    Change(
        id="moe-bias-precast",
        title="The DeepSeek MoE score-correction bias is cast once under AITER",
        pr=39999,
        upstream_since="0.20.0",
        applies_since=None,
        files=(
            Landing("vllm/model_executor/models/deepseek_v2.py"),
            Landing("vllm/_aiter_ops.py"),
            Landing("vllm/model_executor/layers/fused_moe/rocm_aiter_fused_moe.py", until="0.20.2"),
            Landing("vllm/model_executor/layers/fused_moe/router/fused_topk_bias_router.py"),
        ),
        hardening=(),
        probe="vllm_fork.probes.moe:probe_moe_bias_precast",
        tests=(
            "tests/rocm/aiter/test_moe_bias_precast.py",
            # AITER's biased top-k in row chunks with an AITER older than 0.1.12
            # (ROCm/aiter#2611), on the bases whose ROCm image pins one
            "tests/rocm/aiter/test_biased_topk_row_chunks.py",
            # fused_topk_bias asks AITER's biased top-k only for a group count it has a
            # kernel for (#55368, upstream from 0.32.0; 0.19.1-0.31.0)
            "tests/rocm/aiter/test_fused_topk_bias_group_count.py",
        ),
        why="0.19.1 casts the correction bias to the router dtype on every AITER router call",
        retire_when="the change once the oldest supported base is 0.20.0; the pinning tests "
        "once upstream tests the precast itself; the AITER top-k row chunks once the oldest "
        "supported base's ROCm image pins AITER v0.1.12 or newer; the group-count check "
        "once the oldest supported base is 0.32.0",
        # commit: 12-digit prefix; author: v0.20.0 release notes (@heachary), no name or
        # email found
        upstream_commit="fa4b70555bc1",
        upstream_authors=("heachary <https://github.com/heachary>",),
    ),
    Change(
        id="dsv32-decode",
        title="DeepSeek-V3.2 decode on ROCm: bf16 router, metadata reuse, tail-only fills",
        pr=42982,
        upstream_since="0.23.0",
        applies_since=None,
        files=(
            Landing("vllm/model_executor/models/deepseek_v2.py"),
            Landing("vllm/model_executor/models/deepseek_mtp.py"),
            Landing("vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py"),
            # the layer keeps the MQA path for the ROCm impl (#50064 on 0.26.0)
            Landing(
                "vllm/model_executor/layers/attention/mla_attention.py",
                since="0.26.0",
                until="0.26.0",
            ),
            Landing("benchmarks/kernels/benchmark_dsv32_decode_launches.py", added=True),
            # the MTP completeness check scoped to whole loads (#49178 on 0.19.1-0.26.0):
            # its switch, and the weight-transfer engines that turn it off per bucket
            Landing(
                "vllm/model_executor/model_loader/mtp_validation.py",
                until="0.26.0",
                added=True,
            ),
            Landing("vllm/distributed/weight_transfer/nccl_engine.py", until="0.26.0"),
            Landing("vllm/distributed/weight_transfer/ipc_engine.py", until="0.26.0"),
        ),
        hardening=(
            Hardening(
                "complete-metadata-key",
                "metadata reuse is keyed on the exact per-token KV lengths "
                "(upstream's key collides: issue #47042)",
            ),
            Hardening(
                "no-reuse-without-host-seqlens",
                "no reuse without exact host seq_lens (either runner; none under "
                "speculative decoding), and no added device sync",
            ),
            Hardening(
                "bias-precision-guard",
                "the bf16 router is kept only when rounding keeps the loaded bias's "
                "distinct values apart and moves none by more than 2**-10; reloads "
                "copy the bias in place",
            ),
        ),
        probe="vllm_fork.probes.moe:probe_dsv32_decode",
        tests=(
            "tests/rocm/aiter/test_deepseek_router_dtype.py",
            "tests/rocm/aiter/test_mla_sparse_metadata_reuse.py",
            "tests/rocm/aiter/test_mla_sparse_shrink_tail_fills.py",
            "tests/rocm/aiter/test_mla_sparse_metadata_split.py",
            # record_logical_topk_ready of the ROCm impl (#57252 on 0.30.0)
            "tests/rocm/aiter/test_mla_sparse_record_topk_ready.py",
            # FP8 indexer wk pairs split across load_weights calls (#46168, 0.20.0-0.24.0)
            "tests/rocm/aiter/test_deepseek_indexer_wk_fp8_loads.py",
            # the same in the MTP loader (upstream fixed it in 0.33.0; 0.20.0-0.32.0)
            "tests/rocm/aiter/test_deepseek_mtp_indexer_wk_fp8_loads.py",
            # the MTP completeness check off in bucketed updates (#49178, 0.19.1-0.26.0)
            "tests/rocm/aiter/test_deepseek_mtp_bucketed_update.py",
            # FP8 indexer wk of layers another pipeline rank owns (#42944, 0.20.0-0.22.1)
            "tests/rocm/aiter/test_deepseek_indexer_wk_fp8_pp.py",
            # indexer weights of IndexCache skip layers (#46600 on 0.24.0)
            "tests/rocm/aiter/test_deepseek_index_cache_skip_layer_weights.py",
            "tests/rocm/aiter/test_moe_bias_precast.py",
        ),
        why="each decode step copies router logits to float32 per MoE layer, rebuilds "
        "unchanged sparse-MLA metadata and clears whole buffers",
        retire_when="the change once the oldest supported base is 0.23.0; the hardening "
        "once upstream fixes #47042 and guards the router precision",
        # commit: 12-digit prefix; author: release notes (@frida-andersson), email from
        # her sign-off on #50455
        upstream_commit="0b56815a24f4",
        upstream_authors=("Frida Andersson <fanderss@amd.com>",),
    ),
    Change(
        id="ar-rms-pack-gate",
        title="The 1-stage AITER fused allreduce+RMSNorm kernel is gated by its pack size",
        pr=42409,
        upstream_since="0.22.0",
        applies_since="0.21.0",
        files=(
            Landing("vllm/_aiter_ops.py"),
            Landing("vllm/envs.py"),
            # the file exists from 0.25.0; the 1-stage gate moved into it in 0.30.0
            # (before, it is in the fused ops of vllm/_aiter_ops.py)
            Landing(
                "vllm/distributed/device_communicators/aiter_custom_all_reduce.py", since="0.30.0"
            ),
            # the fusion pass stays off with an AITER older than 0.1.14 (AITER #2890),
            # on the bases whose ROCm image pins one; it sets up no AITER custom
            # allreduce under expandable segments with an AITER older than 0.1.20
            # (AITER #4174)
            Landing("vllm/compilation/passes/fusion/allreduce_rms_fusion.py", until="0.24.0"),
            # from 0.25.0 the TP communicator builds AITER's custom allreduce: it
            # builds none there, on the bases whose ROCm image pins an AITER older
            # than 0.1.20
            Landing(
                "vllm/distributed/device_communicators/cuda_communicator.py",
                since="0.25.0",
                until="0.29.0",
            ),
        ),
        hardening=(
            Hardening(
                "two-stage-switch",
                "the 2-stage kernel by default on gfx942 (AITER #4888); "
                "VLLM_ROCM_AITER_AR_RMS_FORCE_2STAGE=1 forces it, =0 keeps the 1-stage one",
            ),
        ),
        probe="vllm_fork.probes.allreduce:probe_ar_rms_pack_gate",
        tests=(
            "tests/rocm/aiter/test_fused_allreduce_rmsnorm_gate.py",
            "tests/rocm/aiter/test_fused_allreduce_rmsnorm_3d_tokens.py",
            "tests/rocm/aiter/test_fused_allreduce_rmsnorm_bf16_norm_tokens.py",
            "tests/rocm/aiter/test_fused_allreduce_rmsnorm_aiter_version.py",
            "tests/rocm/aiter/test_fused_allreduce_rmsnorm_end_sync.py",
            "tests/rocm/aiter/test_fused_allreduce_rmsnorm_declined.py",
            "tests/rocm/aiter/test_aiter_custom_allreduce_expandable_segments.py",
        ),
        why="a hidden-size whitelist keeps shapes such as GPT-OSS's 2880 off the 1-stage kernel",
        retire_when="the change once the oldest supported base is 0.22.0; the switch once "
        "AITER fixes the wrong first graph replay after idle on gfx942",
        # commit: 10-digit prefix; author: release notes (@akii96), name and email from
        # the sign-off of #42833 by the same account
        upstream_commit="be7a03ea65",
        upstream_authors=("Aakif Nawaz <aakif.nawaz@amd.com>",),
    ),
)

SUPPORT: tuple[Support, ...] = (
    Support(
        id="rocm-sim",
        title="Test infrastructure around the ROCm/AITER simulation, which itself lives "
        "once in the fork repository's sim/ (vllm_rocm_sim), not in the tree",
        files=(),
    ),
)


LOCAL_FILE = "local-changes.toml"
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{1,40}$")
_LOCAL_KEYS = {"id", "title", "why", "retire_when", "files", "tests"}
_local_cache: dict[Path, tuple[tuple[int, int], tuple[Change, ...]]] = {}


def local_file() -> Path | None:
    """``local-changes.toml`` of the fork repository in use (None: outside one)."""
    try:
        return find_root() / LOCAL_FILE
    except ConfigError:
        return None


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return tuple(value)


def parse_local(path: Path, text: str | None = None) -> tuple[Change, ...]:
    """The changes ``path`` declares (``text``: its content to be, not read from
    disk); ConfigError (exit 3) names what is wrong."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8") if text is None else text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    entries = data.get("change", [])
    if set(data) - {"change"} or not isinstance(entries, list):
        raise ConfigError(f"{path}: only [[change]] tables belong there")
    builtin = {c.id for c in CHANGES} | {s.id for s in SUPPORT}
    out: list[Change] = []
    for n, entry in enumerate(entries, 1):
        where = f"{path}: change #{n}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} is not a table")
        unknown = sorted(set(entry) - _LOCAL_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
        cid, title = entry.get("id"), entry.get("title")
        if not isinstance(cid, str) or not _ID.match(cid):
            raise ConfigError(f"{where}: id must be lower-case letters, digits and '-'")
        if cid in builtin or any(c.id == cid for c in out):
            raise ConfigError(f"{where}: the id {cid!r} is taken")
        if not isinstance(title, str) or not title.strip() or "\n" in title:
            raise ConfigError(f"{where} ({cid}): title must be one line of text")
        texts = {k: entry.get(k, "") for k in ("why", "retire_when")}
        if not all(isinstance(v, str) and "\n" not in v for v in texts.values()):
            raise ConfigError(f"{where} ({cid}): why and retire_when must be one line")
        out.append(
            Change(
                id=cid,
                title=title.strip(),
                pr=None,
                upstream_since=None,
                applies_since=None,
                files=tuple(Landing(p) for p in _strings(entry.get("files", []), where)),
                hardening=(),
                probe="",
                tests=_strings(entry.get("tests", []), where),
                why=texts["why"] or "the maintainers' own change",
                retire_when=texts["retire_when"] or "when the maintainers drop it",
                local=True,
            )
        )
    return tuple(out)


def local_changes() -> tuple[Change, ...]:
    """The changes of ``local-changes.toml`` (read again only after it changed)."""
    path = local_file()
    if path is None:
        return ()
    try:
        st = path.stat()
    except FileNotFoundError:
        return ()
    stamp = (st.st_mtime_ns, st.st_size)
    held = _local_cache.get(path)
    if held is None or held[0] != stamp:
        held = _local_cache[path] = (stamp, parse_local(path))
    return held[1]


def changes() -> tuple[Change, ...]:
    """Every change, in the order commands report them: the fork's, then the
    maintainers' own (local-changes.toml)."""
    return (*CHANGES, *local_changes())


def change_ids() -> tuple[str, ...]:
    return tuple(c.id for c in changes())


def get(change_id: str) -> Change:
    """The change ``change_id``; ValueError names the known ones."""
    for change in changes():
        if change.id == change_id:
            return change
    raise ValueError(f"unknown change id {change_id!r}; known: {', '.join(change_ids())}")


def find(change_id: str) -> Change | None:
    return next((c for c in changes() if c.id == change_id), None)


def header_ids() -> tuple[str, ...]:
    """Every value a patch's ``Fork-Change`` may take."""
    return (*change_ids(), *(s.id for s in SUPPORT))


def _entry_dict(
    change_id: str,
    title: str,
    why: str = "",
    retire_when: str = "",
    files: Sequence[str] = (),
    tests: Sequence[str] = (),
) -> dict[str, object]:
    entry: dict[str, object] = {"id": change_id, "title": title}
    entry.update({k: v for k, v in (("why", why), ("retire_when", retire_when)) if v})
    entry.update({k: list(v) for k, v in (("files", files), ("tests", tests)) if v})
    return entry


def local_entry(
    change_id: str,
    title: str,
    why: str = "",
    retire_when: str = "",
    files: Sequence[str] = (),
    tests: Sequence[str] = (),
) -> str:
    """The TOML of one ``[[change]]`` entry of local-changes.toml."""
    return "[[change]]\n" + tomli_w.dumps(
        _entry_dict(change_id, title, why, retire_when, files, tests)
    )


def check_paths(files: Sequence[str], tests: Sequence[str]) -> None:
    """Refuse (UsageError, exit 2) a ``--files``/``--tests`` path that is not a
    relative path of the vLLM tree, or a ``--tests`` path that is no fork test module."""
    for path in (*files, *tests):
        parts = path.split("/")
        if not path or path.startswith("/") or "\\" in path or ".." in parts or "" in parts:
            raise UsageError(f"{path!r} is not a relative path of the vLLM tree (a/b/c.py)")
    wrong = [t for t in tests if not is_test_module(t)]
    if wrong:
        raise UsageError(
            f"--tests takes fork test modules of the vLLM tree (tests/.../test_*.py): "
            f"{', '.join(wrong)}"
        )


def declare_local_change(
    root: Path,
    change_id: str,
    title: str,
    why: str = "",
    retire_when: str = "",
    files: Sequence[str] = (),
    tests: Sequence[str] = (),
) -> Path:
    """`vllm-fork change add`: append the entry to ``root``'s local-changes.toml,
    whole or not at all; a taken id or a bad title is refused (ConfigError), a
    bad path (UsageError) before anything changes. The file's path."""
    check_paths(files, tests)
    path = root / LOCAL_FILE
    before = path.read_text(encoding="utf-8") if path.is_file() else ""
    entry = local_entry(change_id, title, why, retire_when, files, tests)
    text = before + ("\n" if before and not before.endswith("\n\n") else "") + entry
    parse_local(path, text)
    write_bytes_atomic(path, text.encode())
    return path


def _render_local(entries: list[dict[str, Any]]) -> str:
    """local-changes.toml as `change add` writes it: one ``[[change]]`` table per
    entry, a blank line between them."""
    return "\n".join("[[change]]\n" + tomli_w.dumps(entry) for entry in entries)


@dataclass(frozen=True)
class Completion:
    """What :func:`complete_local_change` did for one local change."""

    change: str
    files: tuple[str, ...]  # paths added to its ``files``
    tests: tuple[str, ...]  # test modules added to its ``tests``
    written: bool  # False: local-changes.toml has hand edits the tool does not rewrite

    def describe(self, path: Path) -> str:
        added = "; ".join(
            f"{key} += {', '.join(values)}"
            for key, values in (("files", self.files), ("tests", self.tests))
            if values
        )
        if self.written:
            return f"{path}: {self.change}: {added} (from its exported patches)"
        return (
            f"{path}: {self.change}: its patches touch paths the entry does not list; "
            f"add by hand (the file has hand edits the tool does not rewrite): {added}"
        )


def complete_local_change(root: Path, change_id: str, paths: Sequence[str]) -> Completion | None:
    """Add to local change ``change_id``'s entry in ``root``'s local-changes.toml
    every path of ``paths`` (what its patches touch) it does not list: test
    modules to ``tests``, other paths outside ``tests/`` to ``files``. None when
    the entry lists them all already (or ``change_id`` is not a local change).
    The file is rewritten (atomically) only when it is exactly as the tool writes
    it; a hand-edited file (comments, other layout) is left as it is and the
    :class:`Completion` says what to add by hand."""
    path = root / LOCAL_FILE
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    declared = {c.id: c for c in parse_local(path, text)}
    change = declared.get(change_id)
    if change is None:
        return None
    have_files = [f.path for f in change.files]
    tests = [p for p in dict.fromkeys(paths) if is_test_module(p) and p not in change.tests]
    files = [p for p in dict.fromkeys(paths) if not p.startswith("tests/") and p not in have_files]
    if not (files or tests):
        return None
    entries: list[dict[str, Any]] = tomllib.loads(text)["change"]
    written = _render_local(entries) == text
    if written:
        entry = next(e for e in entries if e["id"] == change_id)
        entry["files"] = [*have_files, *files]
        entry["tests"] = [*change.tests, *tests]
        keys = ("id", "title", "why", "retire_when", "files", "tests")
        new = _render_local([{k: e[k] for k in keys if e.get(k)} for e in entries])
        parse_local(path, new)
        write_bytes_atomic(path, new.encode())
    return Completion(change_id, tuple(files), tuple(tests), written)
