"""Put on PYTHONPATH of a precompiled ROCm build only (see ``sitecustomize``)."""
