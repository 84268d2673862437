"""Build provenance beside each wheel: ``<wheel>.intoto.json``.

An in-toto Statement (v1) with a SLSA Provenance (v1) predicate:

- subject: the wheel's file name and sha256;
- resolvedDependencies (the materials): the upstream sdist (and the upstream
  wheel a precompiled build reuses) with their sha256, the patch series as one
  digest (:func:`series_digest`) and the build environment's versions;
- builder: this tool and its version.

Signing is optional and local: with an Ed25519 private key (PEM, made e.g. by
``openssl genpkey -algorithm ed25519 -out key.pem``) the statement is wrapped
in a DSSE envelope whose signature covers the DSSE pre-authentication
encoding of the payload. ``verify`` checks the subject and, given the public
key, the signature. No online signing service is involved.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from vllm_fork import safejson
from vllm_fork.errors import UsageError
from vllm_fork.hashing import sha256_bytes

SUFFIX = ".intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "urn:vllm-fork:build:v1"
SERIES_URI = "urn:vllm-fork:series:"
ENV_URI = "urn:vllm-fork:build-env"


def series_digest(patches: list[dict[str, Any]]) -> str:
    """One sha256 for the series: of ``<sha256>  <file>`` lines in series order."""
    lines = "".join(f"{p['sha256']}  {p['file']}\n" for p in patches)
    return sha256_bytes(lines.encode())


def make_statement(
    record: dict[str, Any],
    *,
    wheel_name: str,
    wheel_sha256: str,
    environment: dict[str, str | None],
) -> dict[str, Any]:
    base = record["base"]
    deps: list[dict[str, Any]] = [
        {
            "uri": f"pkg:pypi/vllm@{base['version']}?file_name={base['sdist']['filename']}",
            "name": base["sdist"]["filename"],
            "digest": {"sha256": base["sdist"]["sha256"]},
        }
    ]
    if base.get("upstream_wheel"):
        wheel = base["upstream_wheel"]
        deps.append(
            {
                "uri": f"pkg:pypi/vllm@{base['version']}?file_name={wheel['filename']}",
                "name": wheel["filename"],
                "digest": {"sha256": wheel["sha256"]},
            }
        )
    patches = record["series"]["patches"]
    deps.append(
        {
            "uri": f"{SERIES_URI}{base['version']}",
            "name": f"series/{base['version']}",
            "digest": {"sha256": series_digest(patches)},
            "annotations": {
                "revision": record["series"]["revision"],
                "patches": [p["file"] for p in patches],
            },
        }
    )
    env = {k: v for k, v in sorted(environment.items()) if v}
    env_bytes = json.dumps(env, sort_keys=True).encode()
    deps.append(
        {
            "uri": ENV_URI,
            "digest": {"sha256": sha256_bytes(env_bytes)},
            "annotations": env,
        }
    )
    tool = record["tool"]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": wheel_name, "digest": {"sha256": wheel_sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "base": base["version"],
                    "mode": record["build"]["mode"],
                    "device": record["build"]["device"],
                    "version": record["version"],
                    # a build on upstream's ROCm wheel: variant, ROCm version, Python, AITER
                    **({"rocm": record["build"]["rocm"]} if record["build"].get("rocm") else {}),
                },
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {
                    "id": f"urn:{tool['name']}:{tool['version']}",
                    "version": {tool["name"]: tool["version"]},
                },
                "metadata": {"invocationId": f"{record['version']}#{wheel_sha256[:16]}"},
            },
        },
    }


# --- DSSE signing ----------------------------------------------------------------


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def keyid(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_bytes(raw)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"cannot read the signing key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(f"{path} is not an Ed25519 private key (PEM, unencrypted)")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        data = Path(path).read_bytes()
        key = serialization.load_pem_public_key(data)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the public key {path}: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UsageError(f"{path} is not an Ed25519 public key (PEM)")
    return key


def dumps(statement: dict[str, Any], key: Ed25519PrivateKey | None = None) -> str:
    """The file's text: the statement, or its DSSE envelope signed with ``key``."""
    payload = json.dumps(statement, indent=2, sort_keys=True).encode()
    if key is None:
        return payload.decode() + "\n"
    envelope = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [
            {
                "keyid": keyid(key.public_key()),
                "sig": base64.b64encode(key.sign(pae(PAYLOAD_TYPE, payload))).decode(),
            }
        ],
    }
    return json.dumps(envelope, indent=2) + "\n"


def check_attestation(
    text: str,
    *,
    record: dict[str, Any],
    wheel_name: str,
    wheel_sha256: str,
    pins: dict[str, Any],
    public_key: Ed25519PublicKey | None = None,
) -> tuple[list[str], str]:
    """(mismatches, how it was signed) for the file's text against the wheel and pins."""
    try:
        doc = safejson.loads(text)
    except ValueError as exc:
        return [str(exc)], "-"
    if not isinstance(doc, dict):
        return ["not a JSON object"], "-"
    signing = "unsigned"
    bad: list[str] = []
    if "payloadType" in doc:
        try:
            payload = base64.b64decode(doc["payload"], validate=True)
            sigs = doc["signatures"]
        except (KeyError, ValueError, TypeError) as exc:
            return [f"malformed DSSE envelope ({exc})"], "-"
        if doc["payloadType"] != PAYLOAD_TYPE:
            bad.append(f"DSSE payloadType {doc['payloadType']}, expected {PAYLOAD_TYPE}")
        if public_key is None:
            bad.append("signed (DSSE) but no public key was given to check the signature")
            signing = "signed, not checked"
        else:
            wanted = keyid(public_key)
            good = False
            for sig in sigs:
                if sig.get("keyid") not in (None, "", wanted):
                    continue
                try:
                    public_key.verify(
                        base64.b64decode(sig["sig"]), pae(doc["payloadType"], payload)
                    )
                    good = True
                except (InvalidSignature, KeyError, ValueError):
                    pass
            if not good:
                bad.append(f"no valid signature by the key {wanted[:16]}")
            signing = f"signature by {wanted[:16]} valid" if good else "signature INVALID"
        try:
            doc = safejson.loads(payload)
        except ValueError as exc:
            return bad + [f"DSSE payload: {exc}"], signing
        if not isinstance(doc, dict):
            return bad + ["DSSE payload is not a JSON object"], signing
    if doc.get("_type") != STATEMENT_TYPE or doc.get("predicateType") != PREDICATE_TYPE:
        bad.append(f"not an in-toto statement with a {PREDICATE_TYPE} predicate")
        return bad, signing
    subjects = [(s.get("name"), s.get("digest", {}).get("sha256")) for s in doc.get("subject", [])]
    if subjects != [(wheel_name, wheel_sha256)]:
        bad.append(f"subject {subjects} is not this wheel ({wheel_name}, sha256 {wheel_sha256})")
    deps = {
        d.get("name") or d.get("uri"): d.get("digest", {}).get("sha256")
        for d in doc.get("predicate", {}).get("buildDefinition", {}).get("resolvedDependencies", [])
    }
    sdist = pins["sdist"]
    if deps.get(sdist["filename"]) != sdist["sha256"]:
        bad.append(
            f"material {sdist['filename']} sha256 {deps.get(sdist['filename'])}, "
            f"bases.toml pins {sdist['sha256']}"
        )
    series = f"series/{record['base']['version']}"
    digest = series_digest(record["series"]["patches"])
    if deps.get(series) != digest:
        bad.append(
            f"material {series} digest {deps.get(series)}, the wheel's record gives {digest}"
        )
    builder = doc.get("predicate", {}).get("runDetails", {}).get("builder", {})
    tool = record["tool"]
    if builder.get("version", {}).get(tool["name"]) != tool["version"]:
        bad.append(f"builder {builder.get('version')} is not {tool['name']} {tool['version']}")
    return bad, signing
