"""What goes out with a wheel: the release files beside it (:mod:`.release_files`:
SBOM, provenance statement, notes), their formats (:mod:`.sbom`,
:mod:`.attestation`, :mod:`.notes`) and the upload (:mod:`.publish`)."""
